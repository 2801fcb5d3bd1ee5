"""Segmented attention (`training/segmented_attention.py`) equals attention under the dense packed mask.

Checked twice: the attention function alone against SDPA under the (L, L) mask that
`tensorize` builds for the same layout (outputs and input gradients, grouped-query heads,
padding), and (in `test_trainer.py`) a whole trainer step on the tiny model with
`segmented_attention` on and off (loss, gradient norm and every LoRA gradient). Tolerances: fp32 round-off of a different
summation order (measured below 1e-6 relative on outputs).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from art_langgraph.training.segmented_attention import Segment, dense_mask, segmented_attention
from art_langgraph.training.tensorize import TrainSequence, micro_batches


class _Module:
    """What transformers' attention functions read off the attention module."""

    num_key_value_groups = 3
    is_causal = True


def test_segments_equal_the_dense_mask_with_gqa_and_padding() -> None:
    g = torch.Generator().manual_seed(0)
    length = 40
    rows = (
        # a tree: a root 0-8 (a system prompt), a part 8-12 under it (a group's task), a
        # rest under both, a rest under the root alone; then a sequence alone; then padding
        (
            Segment(0, 8),
            Segment(8, 12, ((0, 8),)),
            Segment(12, 20, ((0, 8), (8, 12))),
            Segment(20, 27, ((0, 8),)),
            Segment(27, 36),
        ),
        # two sequences alone, filling the row
        (Segment(0, 25), Segment(25, 40)),
    )
    q = torch.randn(2, 6, length, 8, generator=g, requires_grad=True)  # 6 query heads
    k = torch.randn(2, 2, length, 8, generator=g, requires_grad=True)  # 2 key/value heads
    v = torch.randn(2, 2, length, 8, generator=g, requires_grad=True)
    out, _ = segmented_attention(_Module(), q, k, v, None, segments=rows)  # (B, L, H, D)
    mask = dense_mask(rows, length)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), attn_mask=mask
    ).transpose(1, 2)
    real = torch.zeros(2, length, 1, 1)
    real[0, :36] = real[1, :] = 1  # padding positions: zero here, anything under the mask
    torch.testing.assert_close(out * real, ref * real, atol=1e-6, rtol=1e-5)
    w = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad((out * real * w).sum(), (q, k, v))
    want = torch.autograd.grad((ref * real * w).sum(), (q, k, v))
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_segments_must_tile_the_row() -> None:
    q = torch.zeros(1, 3, 10, 4)
    k = v = torch.zeros(1, 1, 10, 4)
    with pytest.raises(ValueError, match="tile the row"):
        segmented_attention(_Module(), q, k, v, None, segments=((Segment(0, 4), Segment(5, 9)),))


def test_tensorize_describes_its_rows_by_segments() -> None:
    head = list(range(10, 40))  # a 30-token prompt shared by two sequences
    seqs = [
        TrainSequence([*head, 1, 2, 3], [False] * 30 + [True] * 3, [math.nan] * 33, 1.0),
        TrainSequence([*head, 4, 5], [False] * 30 + [True] * 2, [math.nan] * 32, -1.0),
        TrainSequence([7, 8, 9, 6], [False, True, True, True], [math.nan] * 4, 0.5),
    ]
    (mb,) = micro_batches(
        seqs, row_length=64, micro_batch_tokens=4096, pack=True, share_prefixes=True
    )
    assert mb.segments is not None
    (row,) = mb.segments
    # The head stops one token short (each rest starts with the prompt's last token).
    assert row == (
        Segment(0, 29),
        Segment(29, 33, ((0, 29),)),
        Segment(33, 36, ((0, 29),)),
        Segment(36, 40),
    )
    dense = mb.attention_mask[0, 0]
    torch.testing.assert_close(dense_mask(mb.segments, dense.shape[-1])[0, 0], dense)
    (padded,) = micro_batches(seqs, row_length=64, micro_batch_tokens=4096, pack=False)
    assert padded.segments is None
