"""One rank of `DistributedTrainer`, in its own process: join the group, then serve commands.

The parent (`scaleout/distributed.py`) sends a spec, then commands, over a connection: a
socket pair for a local child (`main`, run as `python -c`), or an authenticated socket for
a Ray actor (`scaleout/ray_ranks.py`). `join_group` joins the torch process group at the
parent's rendezvous store and builds the rank's `LoRATrainer` (sharded with FSDP when the
spec asks, or when the base does not fit the rank's device); `rank_loop` runs `rl_step`,
`sft_step`, `save`, `load` and the checks (`digest`, `describe`, `param_numel`) until told
to close, sending ("ok", result), ("error", ...) or ("progress", ...) back. Errors travel
as the exception itself when it survives pickling, with its traceback as text.

Left out: the parent's side (sharding, failures, launchers: `scaleout/distributed.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from art_langgraph.training.base import ProgressFn
from art_langgraph.training.config import ModelConfig


def main(fd: int) -> None:
    """A rank's process: read its settings, join the group, then serve the parent's
    commands until "close" or the parent goes."""
    import faulthandler

    faulthandler.enable()  # a fatal signal (an abort in native code) prints the rank's stack
    conn = Connection(fd)
    spec = conn.recv()
    _exit_with_parent(spec["parent_pid"])
    serve(conn, spec)


def serve(conn: Any, spec: dict[str, Any]) -> None:
    """Join the group, say so ("ok", or "error" with why), then run the command loop."""
    try:
        trainer = join_group(spec)
    except BaseException as exc:
        conn.send(("error", portable_error(exc)))
        return
    conn.send(("ok", None))
    rank_loop(conn, trainer, spec["rank"])


def join_group(spec: dict[str, Any]) -> Any:
    """Join the process group and build this rank's trainer (in the rank's process)."""
    import torch
    import torch.distributed as dist

    from art_langgraph.training.trainer import LoRATrainer

    if spec["backend"] == "gloo":
        torch.set_num_threads(spec["threads"])
    if spec["device"].startswith("cuda"):
        torch.cuda.set_device(spec["device"])
    timeout = timedelta(seconds=spec["timeout_s"])
    store = dist.TCPStore(spec["host"], spec["port"], is_master=False, timeout=timeout)
    dist.init_process_group(
        spec["backend"], store=store, rank=spec["rank"], world_size=spec["world"]
    )
    fsdp = spec.get("fsdp")
    if fsdp is None:
        fsdp = _fsdp_needed(spec["base_path"], spec["config"], spec["device"])
        # Every rank must agree (they shard together): any rank short of memory decides.
        flag = torch.tensor([int(fsdp)], device=spec["device"])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        fsdp = bool(flag.item())
    world = dist.group.WORLD
    trainer = LoRATrainer(
        spec["base_path"], spec["config"], spec["device"], fsdp=world if fsdp else None
    )
    trainer.group = world
    torch.manual_seed(spec["config"].seed + spec["rank"])  # each rank's own dropout noise
    return trainer


def rank_loop(conn: Connection, trainer: Any, rank: int) -> None:
    """Serve the parent's commands on `conn` until "close" or the connection ends."""
    import torch.distributed as dist

    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):
            break
        if op == "close":
            break
        try:
            if op == "rl_step":
                seqs, config, relay = args
                result: Any = trainer.rl_step(seqs, config, _relay(conn, rank) if relay else None)
            elif op == "digest":
                result = _digest(trainer)
            elif op == "describe":
                result = {"fsdp": trainer.fsdp, "params": trainer.param_numel()}
            else:  # sft_step, save, load
                result = getattr(trainer, op)(*args)
        except BaseException as exc:
            conn.send(("error", portable_error(exc)))
            continue
        conn.send(("ok", result))
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _relay(conn: Connection, rank: int) -> ProgressFn:
    """A progress callback that sends each event, with this rank, to the parent."""

    def send(stage: str, info: dict[str, Any]) -> None:
        conn.send(("progress", (stage, {**info, "rank": rank})))

    return send


def _digest(trainer: Any) -> str:
    """sha256 of the adapter's weights and the optimizer's state, bit for bit. Under FSDP
    each rank holds other shards by design (nothing to compare; gathered, they would agree
    by construction): only the replicated state, the optimizer's step counts, is hashed."""
    import torch
    from torch.distributed.tensor import DTensor

    h = hashlib.sha256()
    state = trainer.optimizer.state_dict()["state"]
    tensors = [*trainer.params]
    for idx in sorted(state):
        tensors += [v for _, v in sorted(state[idx].items()) if isinstance(v, torch.Tensor)]
    for t in tensors:
        if isinstance(t, DTensor):
            continue
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


FSDP_AUTO_FRACTION = 0.4
"""fsdp=None shards the base when its weights take more than this share of a rank's CUDA
device's memory (the rest is for activations, the logits chunks and the adapter's state)."""


def _fsdp_needed(base_path: str, config: ModelConfig, device: str) -> bool:
    """Whether the base's weights (in the trainer's dtype) pass FSDP_AUTO_FRACTION of
    `device`'s memory. Never on the CPU (its memory is the host's, shared by the ranks)."""
    import torch
    from safetensors import safe_open

    from art_langgraph.runtime.devices import pick_dtype, torch_dtype

    if not device.startswith("cuda"):
        return False
    numel = 0
    for path in Path(base_path).glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is no dict)
                numel += math.prod(f.get_slice(key).get_shape())
    size = torch.empty((), dtype=torch_dtype(pick_dtype(config.dtype, "cuda"))).element_size()
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return numel * size > FSDP_AUTO_FRACTION * total


def portable_error(exc: BaseException) -> tuple[BaseException | None, str]:
    """The exception itself when it survives pickling, and its traceback as text."""
    import pickle

    text = "".join(traceback.format_exception(exc)).rstrip()
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return None, text
    return exc, text


def _exit_with_parent(parent: int) -> None:
    """Exit as soon as the parent is gone (this process is then re-parented)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
