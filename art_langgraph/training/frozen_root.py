"""A prefix tree's root without gradient: its keys and values computed once, then only the branches trained.

A warm start's batch of demonstrations is one prefix tree (`tensorize`): the root all of
them share (a system prompt and the tool specs: 708 of a capitals batch's ~1,500 tokens),
then each demonstration's own rest, which alone holds trained tokens. A step's backward
pass through the root's positions, and under gradient checkpointing their recompute, is
the gradient of the adapter through the root's keys and values: how the adapter should
change the way the prompt is read, as opposed to what the demonstrations' own tokens do
with it. `TrainConfig.sft_frozen_root` drops that part of the gradient for SFT steps: the
root runs once without gradient (`root_kv`, the adapter applied, so what the branches see
is what the model computes), and the branches attend to its keys and values
(`segmented_attention`'s `prefix`), backpropagating through their own positions only.

`root_length` says when it applies: every row of the micro-batch starts with a root that
a later block sees, of one length, with no trained token in it and none predicted by its
last position. Otherwise (sequences alone, a padded batch) the step is unchanged.

Left out: RL steps, whose prompt gradient is kept as ART and TRL keep it; FSDP, where the
extra forward would meet the other ranks' collectives out of turn; shared parts below the
root (a group's task in an RL tree), which stay in the backward.
"""

from __future__ import annotations

from typing import Any

import torch

from art_langgraph.training.segmented_attention import RowSegments


def root_length(segments: tuple[RowSegments, ...] | None, target_mask: torch.Tensor) -> int:
    """The length of the root that `segments`' rows (R of them) all start with and that
    a later block of each sees, when it has no trained token in `target_mask` (R, L) and
    its last position predicts none; else 0."""
    if not segments:
        return 0
    first = {row[0] for row in segments}
    if len(first) != 1:
        return 0
    root = next(iter(first))
    if root.start != 0 or root.sees or root.end < 2:
        return 0
    if not all(any(root.own in seg.sees for seg in row[1:]) for row in segments):
        return 0
    if bool(target_mask[:, : root.end + 1].any()):
        return 0
    return root.end


@torch.no_grad()
def root_kv(
    decoder: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, length: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) of the rows' first `length` positions, (R, Hkv, length,
    D) after the rotary embedding, from `decoder` (the causal LM's transformer, its
    adapter applied) without gradient."""
    out = decoder(
        input_ids=input_ids[:, :length],
        position_ids=position_ids[:, :length],
        use_cache=True,
    )
    cache = out.cache if hasattr(out, "cache") else out.past_key_values  # renamed in v5.2x
    return [(layer.keys, layer.values) for layer in cache.layers]
