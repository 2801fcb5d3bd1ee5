"""Inference engines: token ids in, token ids out, with LoRA adapters served by name."""

from art_langgraph.engine.base import GenerateResult, InferenceEngine, SamplingParams, TokenEvent
from art_langgraph.engine.torch_engine import TorchEngine, TorchEngineConfig

__all__ = [
    "GenerateResult",
    "InferenceEngine",
    "SamplingParams",
    "TokenEvent",
    "TorchEngine",
    "TorchEngineConfig",
]
