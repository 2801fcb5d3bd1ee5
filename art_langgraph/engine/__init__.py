"""Inference engines: token ids in, token ids out, with LoRA adapters served by name.

`TorchEngine` and `VLLMEngine` (a managed vLLM server; its settings `VLLMEngineConfig`)
load on first use, so the protocol can be imported without torch. R engines
behind one router are `art_langgraph.scaleout.ReplicaEngine`."""

from typing import TYPE_CHECKING

from art_langgraph.engine.base import (
    EngineMetrics,
    EngineTraits,
    GenerateResult,
    InferenceEngine,
    SamplingParams,
    TokenEvent,
)
from art_langgraph.runtime.lazy import lazy_getattr

if TYPE_CHECKING:
    from art_langgraph.engine.torch_config import TorchEngineConfig
    from art_langgraph.engine.torch_engine import TorchEngine
    from art_langgraph.engine.vllm_config import VLLMEngineConfig
    from art_langgraph.engine.vllm_engine import VLLMEngine

__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        "TorchEngine": "art_langgraph.engine.torch_engine",
        "TorchEngineConfig": "art_langgraph.engine.torch_config",
        "VLLMEngine": "art_langgraph.engine.vllm_engine",
        "VLLMEngineConfig": "art_langgraph.engine.vllm_config",
    },
)

__all__ = [
    "EngineMetrics",
    "EngineTraits",
    "GenerateResult",
    "InferenceEngine",
    "SamplingParams",
    "TokenEvent",
    "TorchEngine",
    "TorchEngineConfig",
    "VLLMEngine",
    "VLLMEngineConfig",
]
