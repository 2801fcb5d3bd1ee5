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
backend is given no `loggers`: a `LangfuseLogger` when `LANGFUSE_PUBLIC_KEY` and
`LANGFUSE_SECRET_KEY` are set and the `langfuse` extra is installed.

`RunInfo` and `TrajectoryLogger` are defined in `art_langgraph.logger_protocol` (re-exported
here), which the loggers import instead of this module: `loggers_from_env` imports the
Langfuse logger, so the Langfuse logger importing this module would close a circle.

Left out: what each logger does (the modules under `art_langgraph.integrations`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from art_langgraph.logger_protocol import RunInfo, TrajectoryLogger
from art_langgraph.trajectory import TrajectoryGroup

__all__ = ["LoggerSet", "RunInfo", "TrajectoryLogger", "loggers_from_env"]

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
                    "log_metrics and close (art_langgraph.loggers.TrajectoryLogger)"
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


def loggers_from_env() -> list[TrajectoryLogger]:
    """A `LangfuseLogger` when LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY are set (and the
    `langfuse` extra is installed); else none. `ART_LANGFUSE=0` turns this off."""
    if os.environ.get("ART_LANGFUSE", "1") == "0":
        return []
    if not (os.environ.get("LANGFUSE_PUBLIC_KEY") and os.environ.get("LANGFUSE_SECRET_KEY")):
        return []
    try:
        from art_langgraph.integrations.langfuse import LangfuseLogger
    except ImportError as exc:
        log.warning(
            "LANGFUSE_* is set but the langfuse extra is not installed "
            "(pip install 'art-langgraph[langfuse]'): no traces are sent (%s)",
            exc,
        )
        return []
    return [LangfuseLogger()]
