"""`Trainer`: what the backend asks of a trainer, whatever runs it.

The backend prepares each step itself (`prepare_step`, `sft_sequences`: plain data) and
hands the trainer the step's `TrainSequence`s and `TrainConfig`; it gets the step's
metrics back, and the adapter (with the optimizer state) written into a folder it names.
Two implementations: `LoRATrainer` (one process, the backend's thread; `trainer.py`) and
`DistributedTrainer` (W data-parallel ranks in worker processes; `distributed.py`).

Left out: streaming sequences to the trainer while rollouts finish (a step is sent whole).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from art_langgraph.training.config import TrainConfig
    from art_langgraph.training.tensorize import TrainSequence

ProgressFn = Callable[[str, dict[str, Any]], None]
"""Called as progress(stage, info) with stage in {"micro_batch", "optimizer_step"}; a
micro-batch's info is {"index", "tokens", "total_tokens"} (trained tokens: its own, and
the whole step's)."""


@runtime_checkable
class Trainer(Protocol):
    """One LoRA adapter and its optimizer, stepped by the backend.

    A step that raises leaves no trace the backend relies on: it drops the trainer (after
    `close`) and builds a new one from the latest checkpoint."""

    def rl_step(
        self,
        seqs: list[TrainSequence],
        config: TrainConfig,
        progress: ProgressFn | None = None,
    ) -> dict[str, float]:
        """One GRPO optimizer step over the step's sequences; returns its metrics.
        `progress(stage, info)`: see `ProgressFn`."""
        ...

    def sft_step(self, seqs: list[TrainSequence], config: TrainConfig) -> dict[str, float]:
        """One optimizer step of next-token cross-entropy on the trainable tokens."""
        ...

    def save(self, folder: Path) -> None:
        """Write the adapter and the optimizer state into `folder` (which exists)."""
        ...

    def load(self, folder: Path) -> None:
        """Restore what `save` wrote; a failure is a `CheckpointError`."""
        ...

    def close(self) -> None:
        """Release what the trainer holds beyond memory (worker processes). Idempotent."""
        ...
