"""The trainer's state on disk: the LoRA adapter (peft's `adapter_model.safetensors` and
`adapter_config.json`) and AdamW's state (`optimizer.safetensors`, its moments and steps by
parameter index, and `optimizer.json`, its parameter groups).

Under FSDP every rank takes part (each gathers the whole state; rank 0 writes it, and each
rank loads its own shard back), and the files are the ones a single process writes. A
save refuses non-finite adapter weights; a load reads any failure (a missing, truncated or
corrupt file, a shape that does not fit, a non-finite number) as a `CheckpointError`.

Left out: the checkpoint folder's layout and its atomic writes (`backend/checkpoints.py`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from art_langgraph.errors import CheckpointError
from art_langgraph.training.fsdp import full_tensor, local_tensor, shard_like


def save_state(
    folder: Path, model: Any, optimizer: Any, params: Sequence[torch.Tensor], group: Any = None
) -> None:
    """Write the adapter of peft `model` (trainable `params`) and `optimizer`'s state into
    `folder` (which must exist). `group`: the FSDP process group, None without FSDP."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    weights = [full_tensor(p.detach()) for p in params]
    sd = optimizer.state_dict()
    gathered = {  # every rank takes part in the gathers; only rank 0 copies and writes
        f"{idx}.{k}": full_tensor(v.detach())
        for idx, st in sd["state"].items()
        for k, v in st.items()
        if isinstance(v, torch.Tensor)
    }
    if group is not None and dist.get_rank(group) != 0:
        return
    tensors = {k: v.cpu().contiguous() for k, v in gathered.items()}
    if not all(bool(torch.isfinite(w).all()) for w in weights):
        raise CheckpointError(
            folder,
            "the step made the adapter weights non-finite; nothing was saved "
            "(lower the learning rate, or set max_grad_norm)",
        )
    if group is not None:  # the gathered tensors, under the names peft gives the parameters
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        full = {n: w.cpu().contiguous() for n, w in zip(names, weights, strict=True)}
        model.save_pretrained(str(folder), state_dict=full)
    else:
        model.save_pretrained(str(folder))
    save_file(tensors, str(folder / "optimizer.safetensors"))
    (folder / "optimizer.json").write_text(json.dumps({"param_groups": sd["param_groups"]}))


def load_state(
    folder: Path,
    model: Any,
    optimizer: Any,
    params: Sequence[torch.Tensor],
    shard_keys: Sequence[str] | None,
    device: torch.device,
) -> None:
    """Restore what `save_state` wrote into peft `model` (trainable `params`) and
    `optimizer`. `shard_keys`: under FSDP, the adapter's tensor names in `params`' order
    (each rank copies its shard of each); None without FSDP."""
    try:
        _restore(folder, model, optimizer, params, shard_keys, device)
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors, JSON, shapes: all mean "this checkpoint is bad"
        raise CheckpointError(folder, f"cannot restore the trainer: {exc!r}") from exc


def _restore(
    folder: Path, model: Any, optimizer: Any, params: Any, shard_keys: Any, device: Any
) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    fsdp = shard_keys is not None
    on = "cpu" if fsdp else str(device)
    weights = load_file(str(folder / "adapter_model.safetensors"), device=on)
    if not all(bool(torch.isfinite(w).all()) for w in weights.values()):
        raise CheckpointError(folder, "the adapter weights are not all finite")
    if shard_keys is not None:  # each rank keeps its shard of every tensor
        if unexpected := sorted(set(weights) - set(shard_keys)):
            raise CheckpointError(folder, f"unexpected adapter tensors {unexpected[:3]}")
        with torch.no_grad():
            for p, key in zip(params, shard_keys, strict=True):
                local_tensor(p).copy_(local_tensor(shard_like(weights[key].to(p.dtype), p)))
    else:
        result: Any = set_peft_model_state_dict(model, weights)
        if unexpected := list(getattr(result, "unexpected_keys", ())):
            raise CheckpointError(folder, f"unexpected adapter tensors {unexpected[:3]}")
    opt_file = folder / "optimizer.safetensors"
    if opt_file.exists():
        flat = load_file(str(opt_file))
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, v in flat.items():
            idx, name = key.split(".", 1)
            if not bool(torch.isfinite(v).all()):
                raise CheckpointError(folder, f"optimizer tensor {key} is not finite")
            if name != "step":  # a moment: under FSDP this rank's shard, as its param's
                p = params[int(idx)]
                v = shard_like(v, p) if fsdp else v.to(device)
            state.setdefault(int(idx), {})[name] = v
        groups = json.loads((folder / "optimizer.json").read_text())["param_groups"]
        for g in groups:
            g["betas"] = tuple(g["betas"])
        optimizer.load_state_dict({"state": state, "param_groups": groups})
