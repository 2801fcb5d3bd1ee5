"""One copy of the frozen base weights for the engine and the trainer of one process.

`frozen_tensors(model)` lists a freshly loaded model's parameters and buffers by name
(tied weights under each of their names) before any adapter is injected; the engine
keeps that list. `model_over(tensors, like)` builds a second module tree of the same
architecture on the meta device and points every parameter and buffer at those same
tensors, so the trainer's LoRA wraps the engine's weights instead of a copy: the frozen
weights are read by both threads and written by neither (the optimizer only ever holds
the LoRA parameters, and the engine's adapters live in their own layers).

Left out: sharing across dtypes or devices (a trainer in fp32 beside a bf16 engine loads
its own copy), and the engine's merged copy (`TorchEngineConfig.merge_latest`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SharedBase:
    """What an engine offers a trainer in the same process: its frozen weights."""

    tensors: dict[str, torch.Tensor]
    """Every parameter and buffer by name, as loaded (no adapter)."""
    like: Any
    """The engine's model: its class and config build the trainer's module tree."""
    dtype: torch.dtype
    """The weights' dtype; a trainer in another dtype loads its own copy."""
    device: torch.device
    """Where the weights live; a trainer on another device loads its own copy."""


def frozen_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `model` by its name (tied ones under each name)."""
    out: dict[str, torch.Tensor] = {
        name: p.data for name, p in model.named_parameters(remove_duplicate=False)
    }
    out.update(model.named_buffers(remove_duplicate=False))
    return out


def model_over(
    tensors: dict[str, torch.Tensor], like: Any, attn_implementation: str | None = None
) -> Any:
    """A causal LM of `like`'s class and a copy of its config whose parameters and buffers
    are `tensors` (no copy; frozen). `attn_implementation`: the copy's attention function
    (`like` keeps its own). Raises ValueError when the names do not match."""
    config = copy.deepcopy(like.config)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    with torch.device("meta"):
        model = type(like)(config)
    want = set(frozen_tensors(model))
    if want != set(tensors):
        raise ValueError(
            f"weights to share do not match the architecture: missing {sorted(want - set(tensors))[:5]}, "
            f"unexpected {sorted(set(tensors) - want)[:5]}"
        )
    for name, t in tensors.items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        if leaf in module._parameters:
            module._parameters[leaf] = torch.nn.Parameter(t, requires_grad=False)
        else:
            module._buffers[leaf] = t
    # Tied weights were assigned one Parameter object per name; tie them back by identity.
    by_storage: dict[tuple[int, int], torch.nn.Parameter] = {}
    for name, p in list(model.named_parameters(remove_duplicate=False)):
        key = (p.data.data_ptr(), p.data.numel())
        if key in by_storage and by_storage[key] is not p:
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._parameters[leaf] = by_storage[key]
        else:
            by_storage[key] = p
    model.generation_config = like.generation_config
    return model.eval()
