"""The contract between a model and the backend that serves and trains it (`Backend`).

A `Model` knows only this protocol: `LocalBackend` (engine, server and trainer in this
process) implements it, and so can a backend on another machine. Every method takes
the model it acts on; a backend keeps one run per registered model name.

`TrainResult` is what a training call returns, whichever backend ran it. `ModelRef` and
`TrainableModelRef` are a model as a backend sees it (its names and settings):
`art_langgraph.model.Model` and `TrainableModel` satisfy them, and this module never
imports `art_langgraph.model`, which imports it (no import circle, type-only included).

Left out: the wire format of a remote backend (it carries the same calls).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

from pydantic import BaseModel, Field

from art_langgraph.errors import UsageError

if TYPE_CHECKING:
    from art_langgraph.backend.promotion import PromotionDecision
    from art_langgraph.training.base import ProgressFn
    from art_langgraph.training.config import ModelConfig, TrainConfig
    from art_langgraph.trajectories.trajectory import TrajectoryGroup


class ModelRef(Protocol):
    """A model as a backend sees it: `art_langgraph.model.Model` is one."""

    name: str
    """The served name; no '@'."""
    project: str
    """Groups models on disk: {path}/{project}/models/{name}."""
    base_model: str
    """A preset ('tiny'), a HF id or a local folder."""
    inference_base_url: str | None
    """Set by `Backend.register`: the OpenAI base URL."""
    inference_api_key: str | None
    """Set by `Backend.register`: the key for that URL."""

    @property
    def trainable(self) -> bool:
        """True for a `TrainableModelRef`."""
        ...


class TrainableModelRef(ModelRef, Protocol):
    """A trainable model as a backend sees it: `art_langgraph.model.TrainableModel` is one."""

    training: ModelConfig
    """The LoRA and training settings that live with the model."""


def is_trainable(model: ModelRef) -> TypeGuard[TrainableModelRef]:
    """Whether `model` is trainable (then its `training` settings may be read)."""
    return model.trainable


class TrainResult(BaseModel):
    """What one `train` / `train_sft` call did."""

    step: int
    """The step now served (the new checkpoint)."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Rewards, loss, clip fraction, sampler/trainer mismatch, counts of skipped groups, timings."""


def check_sft_args(epochs: int, batch_size: int, stop_loss: float | None) -> None:
    """`Backend.train_sft`'s arguments, checked before anything is sent or trained."""
    if epochs < 1 or batch_size < 1:
        raise UsageError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    if stop_loss is not None and not stop_loss >= 0:  # NaN fails too
        raise UsageError(f"stop_loss must be a loss >= 0 or None, got {stop_loss}")


@runtime_checkable
class Backend(Protocol):
    """Serves models over an OpenAI-compatible endpoint and trains their LoRA adapters."""

    async def register(self, model: ModelRef) -> None:
        """Serve `model` (resuming from its checkpoints); sets its inference URL and key."""
        ...

    async def get_step(self, model: ModelRef) -> int:
        """The step served as `model.name` (0 before any training)."""
        ...

    async def train(
        self,
        model: TrainableModelRef,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        progress: ProgressFn | None = None,
    ) -> TrainResult:
        """One GRPO step; returns once the new step is saved and served. All or nothing."""
        ...

    async def train_sft(
        self,
        model: TrainableModelRef,
        items: list[Any],
        config: TrainConfig,
        epochs: int,
        batch_size: int,
        *,
        stop_loss: float | None = None,
    ) -> TrainResult:
        """A supervised warm start on trajectories or conversations; one new step. With
        `stop_loss`, it ends after the first epoch whose tail loss is at or under it
        (`art_langgraph.training.sft`)."""
        ...

    async def log(self, model: ModelRef, items: list[Any], split: str) -> None:
        """Save trajectories under `split` at the current step; record their mean reward."""
        ...

    async def record_evaluation(
        self, model: TrainableModelRef, step: int, score: float
    ) -> PromotionDecision:
        """Record `step`'s held-out score and decide whether it is promoted (the bare name
        then serves it); needs `ModelConfig.promote_on_evaluation`."""
        ...

    async def delete_checkpoints(self, model: ModelRef, metric: str, keep_last: int) -> list[int]:
        """Keep the last `keep_last` steps and the best by `metric`; returns deleted steps."""
        ...

    async def close(self) -> None:
        """Stop serving; what was trained is already on disk."""
        ...
