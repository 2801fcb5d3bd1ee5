"""Every rollout a backend records, exported to Langfuse as a trace (extra `langfuse`).

`LangfuseLogger` is a `TrajectoryLogger` (art_langgraph/trajectories/logger_protocol.py): turn it on
with `LocalBackend(loggers=[LangfuseLogger()])` or `RemoteBackend(url, loggers=[...])`,
or by setting `LANGFUSE_PUBLIC_KEY` / `LANGFUSE_SECRET_KEY` (`LANGFUSE_BASE_URL`). Each
trajectory becomes one trace (traces.py says what it holds), sent by a `Sender`
(sender.py). The trace id and URL go into `trajectory.metadata` (`langfuse_trace_id`,
`langfuse_trace_url`) before the backend saves the trajectories.

Fail-soft. Export runs on a background thread, fed by a bounded queue. With no server,
or a server that errors, one warning is logged and training carries on; the trajectories
JSONL stays the source of truth. `export_folder` (`art-langgraph langfuse export
MODEL_DIR`) re-sends, synchronously, the batches that did not get through
(`langfuse_exports.jsonl` in the model's folder records those that did, folder.py), and
the held-out evaluations, review picks and judge-calibration scores recorded as unsent
(datasets.py, annotation.py, review.py).

Left out: reading anything back (review.py); step metrics (Langfuse keeps traces and
scores, not metrics).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_langgraph.integrations.langfuse.annotation import resend_review_items
from art_langgraph.integrations.langfuse.config import LangfuseConfig
from art_langgraph.integrations.langfuse.datasets import resend_evaluations
from art_langgraph.integrations.langfuse.folder import (
    exported,
    record_export,
    run_info,
    trajectory_files,
)
from art_langgraph.integrations.langfuse.review import resend_scores
from art_langgraph.integrations.langfuse.sender import Sender
from art_langgraph.integrations.langfuse.traces import Batch, trace_id_for
from art_langgraph.trajectories.logger_protocol import RunInfo
from art_langgraph.trajectories.trajectory import TrajectoryGroup, read_groups, write_jsonl

log = logging.getLogger(__name__)


@dataclass
class ExportReport:
    """What one export sent."""

    batches: int = 0
    trajectories: int = 0
    spans: int = 0
    scores: int = 0
    failed_batches: list[tuple[str, int]] = field(default_factory=list)
    """(split, step) of batches that did not get through."""
    evaluations: int = 0
    """Held-out evaluations (dataset runs, datasets.py) re-sent by `export_folder`."""
    failed_evaluations: list[str] = field(default_factory=list)
    """Run names of recorded evaluations that still did not get through."""
    review_items: int = 0
    """Rollouts picked for review and recorded as unsent, now in their queue (annotation.py)."""
    review_unsent: int = 0
    """Such rollouts that still did not get through."""
    run_scores: int = 0
    """Dataset-run scores of the judge calibration recorded as unsent, now sent (review.py)."""
    run_scores_unsent: int = 0
    """Such scores that still did not get through."""


def _annotate(sender: Sender, groups: Iterable[TrajectoryGroup]) -> int:
    """Write each trajectory's trace id and URL into its metadata; returns how many."""
    n = 0
    for g in groups:
        for t in g.trajectories:
            trace_id = trace_id_for(t)
            t.metadata["langfuse_trace_id"] = trace_id
            t.metadata["langfuse_trace_url"] = sender.trace_url(trace_id)
            n += 1
    return n


class LangfuseLogger:
    """Exports every trajectory a backend records to Langfuse, on a background thread.

    `LangfuseLogger()` reads `LANGFUSE_PUBLIC_KEY`, `LANGFUSE_SECRET_KEY` and
    `LANGFUSE_BASE_URL`; pass a `LangfuseConfig` or its fields to override them."""

    def __init__(self, config: LangfuseConfig | None = None, **fields: Any) -> None:
        self.config = (config or LangfuseConfig(**fields)).resolved()
        self.sender = Sender(self.config)
        self.report = ExportReport()
        self._queue: queue.Queue[Batch | None] = queue.Queue(self.config.max_queued_batches)
        self._warned = False
        self._lock = threading.Lock()
        self._project_looked_up = threading.Event()
        self._thread = threading.Thread(target=self._work, name="langfuse-export", daemon=True)
        self._thread.start()

    # the TrajectoryLogger protocol
    def log_trajectories(
        self, run: RunInfo, step: int, split: str, groups: list[TrajectoryGroup]
    ) -> None:
        # The trace URLs name the project: wait (once, briefly) for its lookup to finish.
        self._project_looked_up.wait(timeout=min(2.0, self.config.timeout_s))
        n = _annotate(self.sender, groups)
        batch = Batch(run, step, split, [g.model_copy(deep=True) for g in groups], n)
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._fail(batch, RuntimeError("the export queue is full"))

    def log_metrics(self, run: RunInfo, step: int, split: str, metrics: dict[str, float]) -> None:
        """Langfuse keeps traces and scores, not step metrics: nothing to send."""

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until queued batches are sent (or failed); False on timeout."""
        deadline = time.monotonic() + (timeout_s or self.config.flush_timeout_s)
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        if not self.flush():
            log.warning(
                "Langfuse: %d batches were not sent within %.0f s; re-send them with "
                "`art-langgraph langfuse export MODEL_DIR`",
                self._queue.unfinished_tasks,
                self.config.flush_timeout_s,
            )
        self._queue.put(None)
        self._thread.join(timeout=1)
        self.sender.close()

    def _work(self) -> None:
        try:
            self.sender.project_id()
        except Exception as exc:
            log.debug("Langfuse: no project id (%s); trace URLs use /trace/{id}", exc)
        self._project_looked_up.set()
        while (batch := self._queue.get()) is not None:
            try:
                spans, scores = self.sender.send(batch)
                with self._lock:
                    self.report.batches += 1
                    self.report.trajectories += batch.trajectories
                    self.report.spans += spans
                    self.report.scores += scores
                record_export(
                    batch.run.folder, batch.split, batch.step, batch.trajectories, spans, scores
                )
            except Exception as exc:
                self._fail(batch, exc)
            finally:
                self._queue.task_done()

    def _fail(self, batch: Batch, exc: BaseException) -> None:
        with self._lock:
            self.report.failed_batches.append((batch.split, batch.step))
            first, self._warned = not self._warned, True
        if first:
            log.warning(
                "Langfuse export to %s failed (%s: %s). Training goes on and the trajectories "
                "JSONL keeps everything; re-send with `art-langgraph langfuse export MODEL_DIR`. "
                "Further failures are logged at debug level.",
                self.config.base_url,
                type(exc).__name__,
                exc,
            )
        else:
            log.debug("Langfuse export failed again: %s", exc)


def export_folder(
    folder: str | Path,
    *,
    step: int | None = None,
    resend: bool = False,
    config: LangfuseConfig | None = None,
) -> ExportReport:
    """Send a model folder's trajectories to Langfuse, synchronously: the batches not yet
    recorded as exported (all of them with `resend=True`), or only `step`; or one step's
    `trajectories/{split}/{step}.jsonl` file. Idempotent."""
    source = Path(folder).resolve()
    folder = source.parents[2] if source.is_file() else source
    run = run_info(folder)
    sender = Sender((config or LangfuseConfig()).resolved())
    try:
        sender.project_id()
    except Exception as exc:
        log.debug("no project id: %s", exc)
    done = set() if resend or step is not None or source.is_file() else exported(folder)
    report = ExportReport()
    try:
        for split, s, path in trajectory_files(source, step):
            if (split, s) in done:
                continue
            groups = read_groups(path)
            batch = Batch(run, s, split, groups, _annotate(sender, groups))
            try:
                spans, scores = sender.send(batch)
            except Exception as exc:
                report.failed_batches.append((split, s))
                log.warning("Langfuse: %s step %d not sent: %s", split, s, exc)
                continue
            write_jsonl(path, groups)  # the trace ids and URLs, written back atomically
            record_export(folder, split, s, batch.trajectories, spans, scores)
            report.batches += 1
            report.trajectories += batch.trajectories
            report.spans += spans
            report.scores += scores
        if not source.is_file():  # what datasets.py, annotation.py, review.py recorded as unsent
            report.evaluations, report.failed_evaluations = resend_evaluations(folder, sender)
            report.review_items, report.review_unsent = resend_review_items(folder, sender=sender)
            report.run_scores, report.run_scores_unsent = resend_scores(folder, sender)
    finally:
        sender.close()
    return report
