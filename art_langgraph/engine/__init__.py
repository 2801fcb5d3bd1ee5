"""Inference engines: token ids in, token ids out, with LoRA adapters served by name.

`TorchEngine` and `ReplicaEngine` (R engines, each in a child process) load on first
use, so the protocol can be imported without torch."""

from typing import TYPE_CHECKING

from art_langgraph._lazy import lazy_getattr
from art_langgraph.engine.base import (
    EngineMetrics,
    GenerateResult,
    InferenceEngine,
    SamplingParams,
    TokenEvent,
)

if TYPE_CHECKING:
    from art_langgraph.engine.replicas import ReplicaEngine
    from art_langgraph.engine.torch_engine import TorchEngine, TorchEngineConfig

__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        **{n: "art_langgraph.engine.torch_engine" for n in ("TorchEngine", "TorchEngineConfig")},
        "ReplicaEngine": "art_langgraph.engine.replicas",
    },
)

__all__ = [
    "EngineMetrics",
    "GenerateResult",
    "InferenceEngine",
    "ReplicaEngine",
    "SamplingParams",
    "TokenEvent",
    "TorchEngine",
    "TorchEngineConfig",
]
