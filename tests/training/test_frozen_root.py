"""A prefix tree's root without gradient (`training/frozen_root.py`): the same logprobs, and the gradient with the root's keys and values held constant.

The reference is the whole row through the trainer's usual forward, with every layer's key
and value projections of the root's positions detached: the branches see the root only
through those, so that is the gradient the frozen root must give. The step must also
differ from the full gradient (the test would otherwise pass with the option doing
nothing), and leave batches without a tree alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from art_langgraph.training.config import TrainConfig
from art_langgraph.training.frozen_root import root_length
from art_langgraph.training.segmented_attention import Segment, segmented_attention
from art_langgraph.training.tensorize import TrainSequence
from art_langgraph.training.trainer import LoRATrainer
from tests.conftest import FP32_TRAINER

LR = 1e-3


class _Module:
    num_key_value_groups = 3
    is_causal = True
    layer_idx = 0


def test_attention_after_a_prefix_equals_attention_over_the_whole_row() -> None:
    g = torch.Generator().manual_seed(0)
    length, p = 30, 8
    row = (
        Segment(0, p),
        Segment(p, 12, ((0, p),)),
        Segment(12, 20, ((0, p), (p, 12))),
        Segment(20, 27, ((0, p),)),
    )  # then padding
    q = torch.randn(1, 6, length, 8, generator=g)
    k = torch.randn(1, 2, length, 8, generator=g)
    v = torch.randn(1, 2, length, 8, generator=g)
    whole, _ = segmented_attention(_Module(), q, k, v, None, segments=(row,))
    part, _ = segmented_attention(
        _Module(),
        q[:, :, p:],
        k[:, :, p:],
        v[:, :, p:],
        None,
        segments=(row,),
        prefix=[(k[:, :, :p], v[:, :, :p])],
    )
    assert part.shape == (1, length - p, 6, 8)
    torch.testing.assert_close(part[:, : 27 - p], whole[:, p:27], atol=1e-6, rtol=1e-5)
    assert not part[:, 27 - p :].any()
    with pytest.raises(ValueError, match="straddles"):
        segmented_attention(
            _Module(), q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], None, segments=(row,),
            prefix=[(k[:, :, :4], v[:, :, :4])],
        )  # fmt: skip
    # a plain causal reference for the branch under the root alone
    keys = torch.cat([k[:, :, :p], k[:, :, 20:27]], 2).repeat_interleave(3, 1)
    vals = torch.cat([v[:, :, :p], v[:, :, 20:27]], 2).repeat_interleave(3, 1)
    mask = torch.ones(7, p + 7, dtype=torch.bool).tril(p)
    ref = F.scaled_dot_product_attention(q[:, :, 20:27], keys, vals, attn_mask=mask)
    torch.testing.assert_close(part[:, 20 - p : 27 - p], ref.transpose(1, 2))


def test_the_root_is_frozen_only_where_nothing_in_it_is_trained() -> None:
    tree = (Segment(0, 8), Segment(8, 12, ((0, 8),)), Segment(12, 16, ((0, 8),)))
    alone = (Segment(0, 10), Segment(10, 16))
    mask = torch.zeros(1, 16, dtype=torch.bool)
    mask[0, 10:12] = mask[0, 14:16] = True
    assert root_length((tree,), mask) == 8
    assert root_length((alone,), mask) == 0  # sequences alone: no root anyone sees
    assert root_length(None, mask) == 0
    assert root_length((tree, tree), torch.cat([mask, mask])) == 8
    assert root_length((tree, (Segment(0, 9), Segment(9, 16, ((0, 9),)))), mask.repeat(2, 1)) == 0
    trained_root = mask.clone()
    trained_root[0, 3] = True
    assert root_length((tree,), trained_root) == 0
    predicted_by_its_end = mask.clone()
    predicted_by_its_end[0, 8] = True  # the root's last state would predict it
    assert root_length((tree,), predicted_by_its_end) == 0


def _demonstrations(seed: int, system: int = 24) -> list[TrainSequence]:
    """Four demonstrations sharing a system prompt: each its own question, then an answer,
    a tool result and a final answer trained."""
    g = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, 2000, (n,), generator=g).tolist()

    common, seqs = rand(system), []
    for k in range(4):
        parts = [(rand(5 + k), False), (rand(4), True), (rand(3), False), (rand(3 + k), True)]
        tokens = list(common)
        trained = [False] * system
        for ids, on in parts:
            tokens += ids
            trained += [on] * len(ids)
        seqs.append(TrainSequence(tokens, trained, [float("nan")] * len(tokens), 1.0))
    return seqs


def _gradients(
    trainer: LoRATrainer, seqs: list[TrainSequence], frozen: bool, detach_root: int = 0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's logprobs and the LoRA gradients of their sum; `detach_root`: the
    reference, every key and value projection of the first positions detached."""
    (mb,), _ = trainer._micro_batches(seqs, TrainConfig(learning_rate=LR))
    hooks = []
    if detach_root:

        def hook(_m: Any, _i: Any, out: torch.Tensor) -> torch.Tensor:
            return torch.cat([out[:, :detach_root].detach(), out[:, detach_root:]], dim=1)

        for name, module in trainer.model.named_modules():
            if name.endswith(("k_proj", "v_proj")) and hasattr(module, "base_layer"):
                hooks.append(module.register_forward_hook(hook))
    trainer.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    try:
        lp = trainer._logprobs(mb, mb.target_mask, frozen_root=frozen)
        lp.sum().backward()
    finally:
        for h in hooks:
            h.remove()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    return lp.detach(), grads


def test_a_frozen_root_gives_the_gradient_with_the_roots_keys_and_values_constant(
    tiny_path: Path,
) -> None:
    trainer = LoRATrainer(str(tiny_path), FP32_TRAINER, device="cpu")
    # a step away from LoRA B = 0, so the adapter changes the root's keys and values
    trainer.sft_step(_demonstrations(seed=1), TrainConfig(learning_rate=LR))
    seqs = _demonstrations(seed=2)
    (mb,), _ = trainer._micro_batches(seqs, TrainConfig(learning_rate=LR))
    cut = root_length(mb.segments, mb.target_mask)
    assert cut == 24
    lp, grads = _gradients(trainer, seqs, frozen=True)
    lp_ref, want = _gradients(trainer, seqs, frozen=False, detach_root=cut)
    lp_full, full = _gradients(trainer, seqs, frozen=False)
    torch.testing.assert_close(lp, lp_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp_ref, lp_full, atol=1e-5, rtol=1e-5)
    assert grads.keys() == want.keys() == full.keys() and grads
    scale = max(float(g.abs().max()) for g in want.values())
    for n, g in grads.items():
        torch.testing.assert_close(g, want[n], atol=1e-4 * scale, rtol=0)
    apart = max(float((full[n] - g).abs().max()) for n, g in grads.items())
    assert apart > 1e-2 * scale  # the root's gradient was there to drop


def test_an_sft_step_with_a_frozen_root_trains(tiny_path: Path) -> None:
    trainer = LoRATrainer(str(tiny_path), FP32_TRAINER, device="cpu")
    seqs = _demonstrations(seed=3)
    config = TrainConfig(learning_rate=1e-2, sft_frozen_root=True)
    losses = [trainer.sft_step(seqs, config)["loss"] for _ in range(6)]
    assert losses[-1] < losses[0] * 0.9, losses
