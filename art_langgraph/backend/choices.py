"""What a `LocalBackend` is asked to run: its engine, its trainer and its server.

Three typed records, one per part, each checked when it is made:

- `EngineChoice`: which inference engine (ours, a managed vLLM server, or `auto`), how
  many replicas and where (processes, or Ray actors), its device and settings, and how
  many of a model's steps it keeps loaded;
- `TrainerChoice`: one trainer in this process, or data-parallel ranks (and FSDP);
- `ServerChoice`: where the OpenAI-compatible server listens, or that there is none.

`LocalBackend(engine=..., trainer=..., server=...)` takes them; its `replicas=`, `ray=`
and `trainer_ranks=` keywords are shorthands for the same fields.

Left out: starting what they name (`backend/engines.py`, `backend/trainers.py`, and the
server in `backend/local.py`), and the server's limits (`serving.ServerConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from art_langgraph.errors import UsageError

EngineKind = Literal["auto", "torch", "vllm"]


@dataclass(frozen=True)
class EngineChoice:
    """The inference engine a `LocalBackend` runs."""

    kind: EngineKind = "auto"
    """"torch" (ours, in this process), "vllm" (a managed vLLM server from `.venv-vllm`;
    `config` is then a `VLLMEngineConfig`), or "auto": vLLM when it is installed and a GPU is
    present, else torch."""
    replicas: int = 1
    """Engines behind one router (>= 1); above 1, each in a process (or Ray actor) of its
    own behind a `ReplicaEngine` (routing, all-or-nothing adapter loads, restarts)."""
    ray_address: str | None = None
    """A Ray address, "auto" (this machine's cluster) or "local" (a Ray instance in this
    process): the torch replicas and the trainer's ranks then run as Ray actors placed on
    the cluster (needs the `ray` extra, and the backend's `path` on a filesystem every node
    reads). None: local processes, no Ray."""
    device: str | None = None
    """The engine's device, which the trainer shares; None: CUDA when present, else the CPU."""
    config: Any = None
    """A `TorchEngineConfig` (torch) or `VLLMEngineConfig` (vllm); None: the defaults."""
    max_loaded_adapters: int = 4
    """A model's steps kept in the engine's memory; older pinned steps load from disk on
    demand."""

    def __post_init__(self) -> None:
        if self.kind not in ("auto", "torch", "vllm"):
            raise UsageError(f"engine must be 'auto', 'torch' or 'vllm', not {self.kind!r}")
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise UsageError(f"replicas must be an integer >= 1, got {self.replicas!r}")
        if self.ray_address is not None and self.kind == "vllm":
            raise UsageError(
                "vLLM replicas are not placed on Ray (only torch ones are): use engine='torch' "
                "with ray, or vLLM without ray"
            )
        if not isinstance(self.max_loaded_adapters, int) or self.max_loaded_adapters < 1:
            raise UsageError(
                f"max_loaded_adapters must be an integer >= 1, got {self.max_loaded_adapters!r}"
            )

    def resolved_kind(self) -> Literal["torch", "vllm"]:
        """The kind "auto" stands for here: vLLM on a GPU when `.venv-vllm` has it."""
        if self.kind != "auto":
            return self.kind
        from art_langgraph.engine.vllm_engine import vllm_python
        from art_langgraph.runtime.devices import pick_device

        on_gpu = pick_device(self.device).startswith("cuda")
        return "vllm" if on_gpu and vllm_python() is not None else "torch"


@dataclass(frozen=True)
class TrainerChoice:
    """The trainer a `LocalBackend` runs beside its engine (on the engine's device)."""

    ranks: int = 1
    """1: one trainer in this process (over the torch engine's very weights, one copy);
    W > 1: W data-parallel ranks in worker processes (gloo on the CPU, NCCL on W GPUs), or
    Ray actors with `EngineChoice.ray_address`."""
    fsdp: bool | None = None
    """With several ranks, or on Ray: shard the frozen base, the adapter and its optimizer
    state over the ranks with FSDP2. None: when the base's weights take more than 40% of a
    rank's CUDA device, never on the CPU."""

    def __post_init__(self) -> None:
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise UsageError(f"trainer_ranks must be an integer >= 1, got {self.ranks!r}")


@dataclass(frozen=True)
class ServerChoice:
    """Where a `LocalBackend`'s OpenAI-compatible server listens (its limits and timeouts
    are `serving.ServerConfig`)."""

    host: str = "127.0.0.1"
    """The address it binds; any other than loopback needs `api_key`."""
    port: int = 0
    """Its port; 0: a free one (the model's `inference_base_url` says which)."""
    api_key: str | None = None
    """The bearer key requests must carry; None: none (loopback only)."""
    http: bool = True
    """False: start no server; the OpenAI app is left in `LocalBackend.app` for a server
    that mounts it (the backend server, `art-langgraph backend`)."""
