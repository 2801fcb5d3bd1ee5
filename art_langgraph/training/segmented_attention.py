"""Attention over a packed micro-batch by segments: each query block sees only the keys it may.

A packed row holds several sequences, or a prefix tree of them: the prompt parts they
share, each once (a system prompt and tool specs, then a group's task), then each
sequence's rest (`tensorize`). Under a dense (L, L) mask every row costs
L² in attention whatever it holds, and the kernel cannot skip masked blocks. On
SmolLM2-135M with 2,048-token rows, attention took half of a trainer step on 2 CPU cores.

Here each segment of a row is one SDPA call over only the keys it sees (rows laid out
alike, such as sequences alone of one length, share each call):

- a sequence alone, or a tree's root: its own earlier tokens (`is_causal`, the flash
  path without a mask: it skips the upper triangle);
- a shared part below the root, or a sequence's rest: the parts above it in full, then
  its own earlier tokens (a (Lq, La + Lq) mask).

So a row costs the sum of Lq·(La + Lq) over its segments instead of L². The result is
the same attention (`tests/training/test_segmented_attention.py` compares logprobs and gradients with
the dense mask).

With `prefix` (`training/frozen_root.py`: a tree's root computed beforehand without
gradient), the layer's keys and values of a row's first positions come from it: the
queries, keys and values given are those of the positions after it, the segments stay in
the row's own positions, and a segment inside the prefix has no queries (no output).

`register_attention()` registers `segmented_attention` with transformers'
`AttentionInterface` as ATTN_IMPLEMENTATION (the trainer does, for its own model). A
forward without the `segments` keyword (a reference pass, or a model whose config says
so by accident) is plain SDPA.

Left out: variable-length kernels (flash-attn's `cu_seqlens`, flex attention): none runs
on a CPU without compiling; on a GPU the per-segment calls cost a launch each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "art_segments"
"""The name under which `segmented_attention` is registered with transformers."""


@dataclass(frozen=True)
class Segment:
    """One contiguous block of a row whose queries share what they see."""

    start: int
    """First position of the block in its row (its queries and its own keys)."""
    end: int
    """One past its last position."""
    sees: tuple[tuple[int, int], ...] = ()
    """(start, end) of the earlier blocks this one also sees in full, root first: the
    shared prompt parts above a sequence's rest in a prefix tree. Empty: none."""

    @property
    def own(self) -> tuple[int, int]:
        return (self.start, self.end)


RowSegments = tuple[Segment, ...]
"""A row's segments in order from position 0, back to back; positions after the last
one are padding (their attention output is zero)."""


def _rest_mask(above: int, n: int, device: torch.device) -> torch.Tensor:
    """(n, above + n) bool: query i sees every key above and its own tokens 0..i."""
    return torch.ones((n, above + n), dtype=torch.bool, device=device).tril(diagonal=above)


def dense_mask(rows: tuple[RowSegments, ...] | list[RowSegments], length: int) -> torch.Tensor:
    """(R, 1, L, L) bool: the same attention as `rows` under one dense mask (the path
    without `segmented_attention`). Padding positions see themselves, so no softmax row
    is empty."""
    mask = torch.zeros((len(rows), 1, length, length), dtype=torch.bool)
    for r, row in enumerate(rows):
        end = 0
        for s in row:
            n = s.end - s.start
            mask[r, 0, s.start : s.end, s.start : s.end] = torch.ones(n, n, dtype=torch.bool).tril()
            for a, b in s.sees:
                mask[r, 0, s.start : s.end, a:b] = True
            end = s.end
        idx = torch.arange(end, length)
        mask[r, 0, idx, idx] = True
    return mask


def segmented_attention(
    module: Any,
    query: torch.Tensor,  # (B, H, L, D)
    key: torch.Tensor,  # (B, Hkv, L, D)
    value: torch.Tensor,  # (B, Hkv, L, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    segments: tuple[RowSegments, ...] | None = None,
    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ((B, L, H, D), None). `prefix`:
    each layer's (keys, values) of the rows' first P positions, (B, Hkv, P, D), without
    gradient; `query`, `key` and `value` are then positions P on."""
    if segments is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    b, h, length, d = query.shape
    at_key = 0  # the row position of query 0
    if prefix is not None:
        pk, pv = prefix[module.layer_idx]
        at_key = pk.shape[2]
        key, value = torch.cat([pk, key], dim=2), torch.cat([pv, value], dim=2)
    if len(segments) != b:
        raise ValueError(f"{len(segments)} rows of segments for a batch of {b}")
    # Grouped-query attention: SDPA reads each key/value head for its `H / Hkv` query heads
    # (`enable_gqa`), with no (B, H, L, D) copy of the keys and values kept for the backward.
    gqa = h != key.shape[1]
    for r, row in enumerate(segments):
        at = 0
        for seg in row:
            if seg.start != at or seg.end <= seg.start:
                raise ValueError(f"row {r}: segments must tile the row from 0, got {row}")
            at = seg.end
    # Rows with the same layout (a batch of sequences alone, of equal length) attend in one
    # SDPA call per segment over all of them, instead of one call per row.
    layouts: dict[RowSegments, list[int]] = {}
    for r, row in enumerate(segments):
        layouts.setdefault(row, []).append(r)
    outs, order = [], []
    for row, members in layouts.items():
        first, n_rows = members[0], len(members)
        if members == list(range(first, first + n_rows)):  # a view, no copy
            qs, ks, vs = (x[first : first + n_rows] for x in (query, key, value))
        else:
            idx = torch.tensor(members, device=query.device)
            qs, ks, vs = query[idx], key[idx], value[idx]
        parts = []
        for seg in row:
            if seg.end <= at_key:  # inside the prefix: no queries
                continue
            if seg.start < at_key:
                raise ValueError(f"a segment {seg.own} straddles the prefix's end {at_key}")
            q = qs[:, :, seg.start - at_key : seg.end - at_key]  # (n, H, len, D)
            k, v = (x[:, :, seg.start : seg.end] for x in (ks, vs))
            if seg.sees:
                k = torch.cat([*(ks[:, :, a:b] for a, b in seg.sees), k], dim=2)
                v = torch.cat([*(vs[:, :, a:b] for a, b in seg.sees), v], dim=2)
                n = seg.end - seg.start
                mask = _rest_mask(k.shape[2] - n, n, query.device)
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=gqa
                )
            else:
                out = F.scaled_dot_product_attention(
                    q, k, v, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=gqa
                )
            parts.append(out)  # (n, H, len, D)
        if row[-1].end < at_key + length:
            parts.append(query.new_zeros((n_rows, h, at_key + length - row[-1].end, d)))
        outs.append(torch.cat(parts, dim=2))  # (n, H, L, D)
        order += members
    out = torch.cat(outs, dim=0)  # (B, H, L, D), rows in `order`
    if order != list(range(b)):
        inverse = torch.empty(b, dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(b)
        out = out[inverse.to(out.device)]
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> str:
    """Register `segmented_attention` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, segmented_attention)
    return ATTN_IMPLEMENTATION
