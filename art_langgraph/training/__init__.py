"""GRPO training: config, advantages, token-exact tensorization, losses, the LoRA trainer, SFT."""

from art_langgraph.training.advantages import compute_advantages, is_zero_variance
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.training.tensorize import (
    TensorizeStats,
    TrainSequence,
    build_sequences,
    micro_batches,
    pack_rows,
)

__all__ = [
    "ModelConfig",
    "TensorizeStats",
    "TrainConfig",
    "TrainSequence",
    "build_sequences",
    "compute_advantages",
    "is_zero_variance",
    "micro_batches",
    "pack_rows",
]
