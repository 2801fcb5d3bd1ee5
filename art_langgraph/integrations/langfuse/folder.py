"""A model's folder as the Langfuse integration reads and writes it.

The backend saves each step's groups (`CheckpointFolder`, backend/checkpoints.py, knows
where: `trajectory_files` asks it, `saved_groups` reads them, each trajectory once); the
exporter records each batch that got through in `langfuse_exports.jsonl`
(`record_export`, read back by `exported`), so a re-send skips them. The review queue,
the dataset runs and the calibration scores keep their own record files (annotation.py,
datasets.py, review.py), all JSON lines through `art_langgraph.trajectories.records` (a torn last line,
from a process killed mid-append, skipped), stamped with a time by `append_stamped`, and
`latest_unsent` reads what a re-send still owes.

Left out: the backend's own files (checkpoints, history, saved batches), which only
`CheckpointFolder` reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

from art_langgraph.backend.checkpoints import CheckpointFolder
from art_langgraph.errors import UsageError
from art_langgraph.trajectories import records as records_
from art_langgraph.trajectories.logger_protocol import RunInfo
from art_langgraph.trajectories.trajectory import TrajectoryGroup, read_groups

EXPORTS_FILE = "langfuse_exports.jsonl"
"""In the model's folder: one line per batch sent (split, step, counts, time)."""


def trajectory_files(folder: Path, step: int | None) -> list[tuple[str, int, Path]]:
    """(split, step, file) of a model folder's saved batches, all or only `step`'s; or of
    `folder` itself when it is one step's saved batch."""
    if folder.is_file():
        _, split, at = CheckpointFolder.trajectory_file_of(folder)
        return [(split, at, folder)]
    model = CheckpointFolder(folder)
    if not model.trajectories.is_dir():
        raise UsageError(f"{folder} has no saved trajectories: is it a model's folder?")
    return model.trajectory_files(step)


def first_copies(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """Each trajectory once, as first saved: a folder holds a trajectory again when it was
    logged for review at one step and trained at a later one."""
    seen: set[str] = set()
    out = []
    for g in groups:
        fresh = [t for t in g.trajectories if t.id not in seen]
        seen.update(t.id for t in fresh)
        if fresh:
            out.append(g.model_copy(update={"trajectories": fresh}) if len(fresh) < len(g) else g)
    return out


def saved_groups(source: str | Path, step: int | None = None) -> list[TrajectoryGroup]:
    """The groups of a model folder (all steps, or only `step`) or of one trajectories
    JSONL file, each trajectory once (`first_copies`)."""
    p = Path(source)
    files = [f for _, _, f in trajectory_files(p, step)] if p.is_dir() else [p]
    return first_copies([g for f in files for g in read_groups(f)])


def append_stamped(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Append `records` to the JSON-lines file `path`, each stamped with `time`
    (`art_langgraph.trajectories.records.append_records`: one write, fsynced, a torn tail cut first)."""
    now = time.time()
    records_.append_records(path, [{**r, "time": now} for r in records])


def latest_unsent(path: Path, key: Callable[[dict[str, Any]], Hashable]) -> list[dict[str, Any]]:
    """The records whose latest line (by `key`) says `"status": "unsent"`: what a re-send
    still has to send. A record `key` cannot read (KeyError, TypeError) is skipped."""
    last: dict[Hashable, dict[str, Any]] = {}
    for rec in records_.read_records(path, missing_ok=True):
        try:
            last[key(rec)] = rec
        except (KeyError, TypeError):
            continue
    return [r for r in last.values() if r.get("status") == "unsent"]


def exported(folder: Path) -> set[tuple[str, int]]:
    """(split, step) of the batches recorded as sent (a torn line: that batch counts as not sent)."""
    done = set()
    for rec in records_.read_records(folder / EXPORTS_FILE, missing_ok=True):
        try:
            done.add((str(rec["split"]), int(rec["step"])))
        except (ValueError, KeyError, TypeError):
            continue
    return done


def record_export(
    folder: Path | None, split: str, step: int, trajectories: int, spans: int, scores: int
) -> None:
    """Record a sent batch (nothing without a folder: a remote backend's model)."""
    if folder is None:
        return
    line = {
        "split": split,
        "step": step,
        "trajectories": trajectories,
        "spans": spans,
        "scores": scores,
    }
    append_stamped(folder / EXPORTS_FILE, [line])


def run_info(folder: Path) -> RunInfo:
    """The model a folder holds, as the exporter names it: `{path}/{project}/models/{name}`."""
    return RunInfo(
        name=folder.name,
        project=folder.parent.parent.name,
        base_model=CheckpointFolder(folder).base_model(),
        folder=folder,
    )
