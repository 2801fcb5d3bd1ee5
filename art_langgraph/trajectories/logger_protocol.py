"""The types a backend and its loggers share: `RunInfo` and the `TrajectoryLogger` protocol.

They live apart from `art_langgraph.trajectories.loggers` (which fans a backend's calls out and builds
the default loggers from the environment) so that a logger module, such as the Langfuse
exporter, imports them without importing `loggers`, and `loggers` can build that logger
without an import circle. `art_langgraph.trajectories.loggers` re-exports both.

Left out: calling loggers (`loggers.LoggerSet`) and what each logger does (the modules
under `art_langgraph.integrations`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from art_langgraph.trajectories.trajectory import TrajectoryGroup


@dataclass(frozen=True)
class RunInfo:
    """Which model a logged batch belongs to."""

    name: str
    """The model's name (served as `name@step`)."""
    project: str
    """The model's project."""
    base_model: str | None
    """The base model it trains (a preset, a HF id or a path); None when not known."""
    folder: Path | None = None
    """The model's folder on this machine (LocalBackend); None for a remote backend."""


@runtime_checkable
class TrajectoryLogger(Protocol):
    """What a backend calls; implementations must not block for long and may raise (guarded)."""

    def log_trajectories(
        self, run: RunInfo, step: int, split: str, groups: list[TrajectoryGroup]
    ) -> None:
        """A batch of groups at `step` ("train": the step they train; else the step that sampled
        them). Called before the batch is saved: writing to `trajectory.metadata` is kept."""
        ...

    def log_metrics(self, run: RunInfo, step: int, split: str, metrics: dict[str, float]) -> None:
        """The metrics of a committed step (train) or of a logged split."""
        ...

    def close(self) -> None:
        """Flush what is queued (bounded in time) and release resources."""
        ...
