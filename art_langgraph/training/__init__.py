"""GRPO training: config, advantages, token-exact tensorization, losses, the LoRA trainer, SFT.

The torch-backed names (tensorization) load torch on first use; the configs do not."""

from typing import TYPE_CHECKING

from art_langgraph.runtime.lazy import lazy_getattr
from art_langgraph.training.advantages import compute_advantages, is_zero_variance
from art_langgraph.training.config import ModelConfig, TrainConfig

if TYPE_CHECKING:
    from art_langgraph.training.tensorize import (
        TensorizeStats,
        TrainSequence,
        build_sequences,
        micro_batches,
        pack_rows,
    )

__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        n: "art_langgraph.training.tensorize"
        for n in (
            "TensorizeStats",
            "TrainSequence",
            "build_sequences",
            "micro_batches",
            "pack_rows",
        )
    },
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
