"""The contract between a backend and the places its trajectories and metrics are sent.

A backend (`LocalBackend`, `RemoteBackend`) takes `loggers=[...]`: objects meeting the
`TrajectoryLogger` protocol. For each batch of trajectories it records (a train step's
groups, or `model.log(groups, split=...)`), it calls `log_trajectories` *before* the
batch is saved, so a logger may write ids into `trajectory.metadata` (the Langfuse trace
id and URL) and the saved JSONL keeps them. After a step commits, it calls `log_metrics`.
`close()` flushes, when the backend closes.

`LoggerSet` is how a backend calls them: every call is guarded, so a logger that raises
is reported once as a warning and never fails or blocks a training step; the
trajectories JSONL stays the source of truth. `loggers_from_env()` is the default when a
backend is given no `loggers`: what the factories registered with `register_env_factory`
return (the package root registers `integrations.env`: a `LangfuseLogger` when
`LANGFUSE_PUBLIC_KEY` and `LANGFUSE_SECRET_KEY` are set and the `langfuse` extra is
installed). This module imports no integration: the backends sit below them.

`RunInfo` and `TrajectoryLogger` are defined in `art_langgraph.trajectories.logger_protocol`
(re-exported here), which the loggers import.

Left out: what each logger does (the modules under `art_langgraph.integrations`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from art_langgraph.trajectories.logger_protocol import RunInfo, TrajectoryLogger
from art_langgraph.trajectories.trajectory import TrajectoryGroup

log = logging.getLogger(__name__)


class LoggerSet:
    """Fans a backend's calls out to its loggers; a logger that raises is warned about once."""

    def __init__(self, loggers: Iterable[TrajectoryLogger] | None) -> None:
        self.loggers = list(loggers_from_env() if loggers is None else loggers)
        for lg in self.loggers:
            if not isinstance(lg, TrajectoryLogger):
                from art_langgraph.errors import UsageError

                raise UsageError(
                    f"{type(lg).__name__} is not a logger: it needs log_trajectories, "
                    "log_metrics and close (art_langgraph.trajectories.loggers.TrajectoryLogger)"
                )
        self._warned: set[int] = set()

    def _guard(self, lg: TrajectoryLogger, what: str, exc: Exception) -> None:
        if id(lg) not in self._warned:
            self._warned.add(id(lg))
            log.warning(
                "logger %s failed in %s (training goes on; the trajectories JSONL has "
                "everything): %s: %s",
                type(lg).__name__,
                what,
                type(exc).__name__,
                exc,
            )

    def trajectories(
        self, run: RunInfo, step: int, split: str, groups: list[TrajectoryGroup]
    ) -> None:
        for lg in self.loggers:
            try:
                lg.log_trajectories(run, step, split, groups)
            except Exception as exc:
                self._guard(lg, "log_trajectories", exc)

    def metrics(self, run: RunInfo, step: int, split: str, metrics: dict[str, float]) -> None:
        for lg in self.loggers:
            try:
                lg.log_metrics(run, step, split, dict(metrics))
            except Exception as exc:
                self._guard(lg, "log_metrics", exc)

    def close(self) -> None:
        for lg in self.loggers:
            try:
                lg.close()
            except Exception as exc:
                self._guard(lg, "close", exc)


_ENV_FACTORIES: list[Callable[[], list[TrajectoryLogger]]] = []
"""The functions `loggers_from_env` calls, in order."""


def register_env_factory(factory: Callable[[], list[TrajectoryLogger]]) -> None:
    """Add a function that returns the loggers its environment asks for. The package root
    registers the integrations' (`art_langgraph.integrations.env`), so this module names
    none of them."""
    if factory not in _ENV_FACTORIES:
        _ENV_FACTORIES.append(factory)


def loggers_from_env() -> list[TrajectoryLogger]:
    """What every registered factory returns: a `LangfuseLogger` when LANGFUSE_PUBLIC_KEY
    and LANGFUSE_SECRET_KEY are set and the `langfuse` extra is installed
    (`ART_LANGFUSE=0` turns it off); else none."""
    out: list[TrajectoryLogger] = []
    for factory in _ENV_FACTORIES:
        out.extend(factory())
    return out
