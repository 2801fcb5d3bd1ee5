"""A model's folder as the Langfuse integration reads and writes it.

The backend saves each step's groups in `trajectories/{split}/{step}.jsonl`
(`trajectory_files` lists them, `saved_groups` reads them, each trajectory once); the
exporter records each batch that got through in `langfuse_exports.jsonl`
(`record_export`, read back by `exported`), so a re-send skips them. The review queue
and the dataset runs keep their own records (annotation.py, datasets.py).

Left out: the backend's own files (checkpoints, the model's record: backend/checkpoints.py),
which are only read, for the base model's name (`run_info`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

from art_langgraph.backend.checkpoints import recorded_base_model
from art_langgraph.errors import UsageError
from art_langgraph.logger_protocol import RunInfo
from art_langgraph.trajectory import TrajectoryGroup, read_groups

__all__ = [
    "EXPORTS_FILE",
    "exported",
    "first_copies",
    "record_export",
    "run_info",
    "saved_groups",
    "trajectory_files",
]

EXPORTS_FILE = "langfuse_exports.jsonl"
"""In the model's folder: one line per batch sent (split, step, counts, time)."""


def trajectory_files(folder: Path, step: int | None) -> Iterator[tuple[str, int, Path]]:
    """(split, step, file) of a model folder's saved batches, all or only `step`'s; or of
    `folder` itself when it is one step's `trajectories/{split}/{step}.jsonl`."""
    if folder.is_file():  # one step's file: {folder}/trajectories/{split}/{step}.jsonl
        if not (folder.stem.isdigit() and folder.parent.parent.name == "trajectories"):
            raise UsageError(
                f"{folder} is not a model's trajectories/{{split}}/{{step}}.jsonl: "
                "pass the file the backend wrote, or the model's folder"
            )
        yield folder.parent.name, int(folder.stem), folder
        return
    root = folder / "trajectories"
    if not root.is_dir():
        raise UsageError(f"{folder} has no trajectories/ folder: is it a model's folder?")
    for split_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(split_dir.glob("*.jsonl")):
            if f.stem.isdigit() and (step is None or int(f.stem) == step):
                yield split_dir.name, int(f.stem), f


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


def exported(folder: Path) -> set[tuple[str, int]]:
    """(split, step) of the batches recorded as sent."""
    path = folder / EXPORTS_FILE
    if not path.exists():
        return set()
    done = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            done.add((str(rec["split"]), int(rec["step"])))
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from a kill: that batch counts as not sent
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
        "time": time.time(),
    }
    with open(folder / EXPORTS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def run_info(folder: Path) -> RunInfo:
    """The model a folder holds, as the exporter names it: `{path}/{project}/models/{name}`."""
    return RunInfo(
        name=folder.name,
        project=folder.parent.parent.name,
        base_model=recorded_base_model(folder),
        folder=folder,
    )
