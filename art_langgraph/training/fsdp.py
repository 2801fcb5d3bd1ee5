"""FSDP2 for the LoRA trainer: sharding the model over the ranks, and moving tensors
between their shards and their whole.

`shard_model` makes each decoder layer (the model's `_no_split_modules`) an FSDP unit and
the trainer's root module (embedding, norm, head) the last one, with gradients summed, not
averaged, over the ranks (each rank's loss is already divided by the whole step's counts).
`full_tensor`/`local_tensor`/`shard_like` go between a DTensor shard and the whole tensor
(checkpoints are always written whole); `adapter_keys` names each trainable parameter as
peft saves it. Used by `LoRATrainer(fsdp=group)` (`training/trainer.py`), which says what
was measured.

Left out: mixed precision policies and CPU offload of FSDP2, and NCCL (untested: no GPU).
"""

from __future__ import annotations

from typing import Any

import torch


def shard_model(root: torch.nn.Module, group: Any, device: torch.device) -> Any:
    """FSDP2 over `group`: each decoder layer (the model's `_no_split_modules`) is its own
    unit, all-gathered for its forward and backward only; `root` takes the rest. Gradients
    are summed over the ranks, not averaged: each rank's loss is already divided by the
    whole step's counts."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = DeviceMesh.from_group(group, device.type)
    kinds = set(getattr(getattr(root, "base", root), "_no_split_modules", None) or ())
    for layer in [m for m in root.modules() if type(m).__name__ in kinds]:
        fully_shard(layer, mesh=mesh)
    sharded: Any = fully_shard(root, mesh=mesh)
    for module in sharded.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return sharded


def adapter_keys(model: Any) -> list[str]:
    """The key each trainable parameter has in a saved adapter (peft drops the adapter's
    name), in `model.parameters()` order."""
    from peft import get_peft_model_state_dict

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    index = {n: torch.tensor(i) for i, n in enumerate(names)}
    saved = get_peft_model_state_dict(model, state_dict=index, save_embedding_layers=False)
    keys = {int(i): k for k, i in saved.items()}
    assert sorted(keys) == list(range(len(names))), "an adapter tensor peft would not save"
    return [keys[i] for i in range(len(names))]


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: all-gathered when it is a shard (a DTensor), else `t`."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t` (a DTensor's local shard, else `t`)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` cut as `like` is (a DTensor: this rank's shard of it), on `like`'s device.
    Every rank must pass the same `full`."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = full.to(like.device)
    if not isinstance(like, DTensor):
        return full
    # every rank holds the same `full` (read from the same file): cut the shard locally
    # instead of scattering rank 0's copy (src_data_rank=0, the default)
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
