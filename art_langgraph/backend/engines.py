"""Which inference engine a `LocalBackend` starts, and starting it.

`start_engine` turns an `EngineChoice` (`backend/choices.py`: what the backend was asked
for) into a running `InferenceEngine`:

- on Ray (`ray_address` set): `replicas` torch engines as Ray actors (`ReplicaEngine.start_ray`);
- `replicas` > 1: that many engines, each in a process of its own (`ReplicaEngine.start`);
- else one engine: vLLM (a managed server from `.venv-vllm`) or ours (`TorchEngine`), the
  kind `resolved_kind` picks ("auto": vLLM with a GPU and vLLM installed, else torch).

Left out: the server in front of the engine (`backend/local.py`) and the trainer beside it
(`backend/trainers.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_langgraph.backend.choices import EngineChoice
from art_langgraph.engine.base import InferenceEngine


@dataclass
class StartedEngine:
    """A running engine, and the Ray placement it holds (when on Ray)."""

    engine: InferenceEngine
    ray: Any = None
    """The connected Ray module (on Ray), which the trainer ranks are placed with too."""
    share: Any = None
    """Each replica's and rank's share of the cluster (`ray_cluster.shares`)."""
    ray_started: bool = False
    """Whether this process started the Ray instance ("local"), so it shuts it down."""


def start_engine(
    choice: EngineChoice, base_path: str, logs: Path, lora_rank: int, trainer_ranks: int
) -> StartedEngine:
    """Start the engine `choice` names over the base model at `base_path`; its logs (vLLM's,
    the replicas') go under `logs`; `lora_rank` bounds the adapters vLLM accepts;
    `trainer_ranks` is counted into the Ray placement."""
    if choice.ray_address is not None:
        from art_langgraph.engine.torch_engine import TorchEngineConfig
        from art_langgraph.scaleout.ray_cluster import connect, ray_module, shares
        from art_langgraph.scaleout.replicas import ReplicaEngine

        started = not ray_module().is_initialized() and choice.ray_address == "local"
        ray = connect(choice.ray_address)
        share = shares(ray, choice.replicas, trainer_ranks)
        engine: InferenceEngine = ReplicaEngine.start_ray(
            ray,
            base_path,
            choice.replicas,
            choice.config or TorchEngineConfig(device=choice.device),
            share,
        )
        return StartedEngine(engine, ray=ray, share=share, ray_started=started)
    if choice.replicas > 1:
        from art_langgraph.scaleout.replicas import ReplicaEngine

        engine = ReplicaEngine.start(
            choice.resolved_kind(),
            base_path,
            choice.replicas,
            choice.config,
            logs,
            device=choice.device,
            lora_rank=lora_rank,
        )
    elif choice.resolved_kind() == "vllm":
        from art_langgraph.engine.vllm_engine import VLLMEngine

        engine = VLLMEngine.start(base_path, choice.config, logs / "vllm.log", lora_rank)
    else:
        from art_langgraph.engine.torch_engine import TorchEngine, TorchEngineConfig

        cfg = choice.config or TorchEngineConfig(device=choice.device)
        engine = TorchEngine.from_pretrained(base_path, cfg)
    return StartedEngine(engine)
