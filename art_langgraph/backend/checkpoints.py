"""A model's folder on disk: checkpoints, metrics history and trajectories, all written atomically.

Layout (ART's):

    {path}/{project}/models/{name}/
        checkpoints/{step:04d}/     peft adapter + optimizer state + checkpoint.json (written last)
        history.jsonl               one line of metrics per step (and per logged split)
        trajectories/{split}/{step:04d}.jsonl

A checkpoint is built in a hidden temp folder beside its final place and renamed into
place only when complete, so a process killed mid-write leaves the previous
checkpoint intact and no half-written one. A folder (or stray file) named like a step
that has no valid `checkpoint.json` (a copy gone wrong, a disk error) is never loaded
and never deleted: it is renamed aside with a warning. The history is derivable from
the checkpoints: each marker holds its step's metrics, and `reconcile_history` restores
a line a kill lost. Every path handed out stays inside the
model's folder.

Two views of one folder: `CheckpointFolder` only reads (the complete steps, their
markers, the base model they were trained on, the history, the saved batches), so any
process may open it: the CLI's promotion, the review page, the Langfuse export, the
harness's report. It is the only code that knows the layout. `CheckpointStore` is the trainer's: it
creates the folder and, when opened, tidies it (temp folders removed, invalid ones set
aside), which only the process that writes checkpoints may do.

Left out: remote storage (S3 and the like).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from art_langgraph.errors import UsageError
from art_langgraph.trajectories.records import append_records, read_records

log = logging.getLogger(__name__)

MARKER = "checkpoint.json"
MODELS, CHECKPOINTS, TRAJECTORIES = "models", "checkpoints", "trajectories"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CheckpointFolder:
    """A model's checkpoints, read only: no folder is created, tidied or set aside, so any
    process may open one, while the trainer writes."""

    @classmethod
    def of(cls, path: str | os.PathLike[str], project: str, name: str) -> CheckpointFolder:
        """The folder of model `name` of `project` under a backend's `path`."""
        return cls(Path(path) / project / MODELS / name)

    @staticmethod
    def find(path: str | os.PathLike[str], name: str) -> list[CheckpointFolder]:
        """The folders of every model called `name` under `path` that has checkpoints, one
        per project."""
        found = [CheckpointFolder(f) for f in sorted(Path(path).glob(f"*/{MODELS}/{name}"))]
        return [f for f in found if f.has_checkpoints()]

    @staticmethod
    def all(path: str | os.PathLike[str]) -> list[CheckpointFolder]:
        """Every model folder under a backend's `path`, with or without checkpoints."""
        return [CheckpointFolder(f) for f in sorted(Path(path).glob(f"*/{MODELS}/*")) if f.is_dir()]

    @property
    def project(self) -> str:
        """The project the folder is under ({path}/{project}/models/{name})."""
        return self.root.parent.parent.name

    def has_checkpoints(self) -> bool:
        """Whether the folder holds a checkpoints folder (a model a backend trained)."""
        return self.checkpoints.is_dir()

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.checkpoints = self.root / CHECKPOINTS
        self.history_file = self.root / "history.jsonl"
        self.trajectories = self.root / TRAJECTORIES

    def _inside(self, p: Path) -> Path:
        p = p.resolve()
        if p != self.root and self.root not in p.parents:
            raise UsageError(f"{p} is outside the model's folder {self.root}")
        return p

    def path(self, step: int) -> Path:
        if not isinstance(step, int) or step < 0:
            raise UsageError(f"a checkpoint step is an int >= 0, got {step!r}")
        return self._inside(self.checkpoints / f"{step:04d}")

    @staticmethod
    def _meta(p: Path) -> dict[str, Any] | None:
        try:
            meta = json.loads((p / MARKER).read_text())
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) and meta.get("step") == int(p.name) else None

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, ascending (none when there is no folder)."""
        try:
            found = list(self.checkpoints.iterdir())
        except OSError:
            return []
        return sorted(int(p.name) for p in found if p.name.isdigit() and self._meta(p) is not None)

    def latest(self) -> int | None:
        s = self.steps()
        return s[-1] if s else None

    def meta(self, step: int) -> dict[str, Any]:
        m = self._meta(self.path(step))
        if m is None:
            raise UsageError(f"no complete checkpoint for step {step} in {self.checkpoints}")
        return m

    def base_model(self) -> str | None:
        """The base model the checkpoints were trained on (the latest marker that says);
        None when none records one."""
        base = None
        for step in self.steps():
            base = self.meta(step).get("base_model") or base
        return base

    # ------------------------------------------------------ history, trajectories
    def history(self) -> list[dict[str, Any]]:
        """The metrics history, one record per step and logged split (none yet: [])."""
        return read_records(self.history_file, missing_ok=True)

    def trajectory_file(self, split: str, step: int) -> Path:
        """Where step `step`'s batch of `split` is saved (it may not exist)."""
        if not split.replace("_", "").replace("-", "").isalnum():
            raise UsageError(f"split names are letters, digits, '-' and '_'; got {split!r}")
        if not isinstance(step, int) or step < 0:
            raise UsageError(f"a step is an int >= 0, got {step!r}")
        return self._inside(self.trajectories / split / f"{step:04d}.jsonl")

    def trajectory_files(self, step: int | None = None) -> list[tuple[str, int, Path]]:
        """(split, step, file) of every saved batch, or only `step`'s, by split then step."""
        if not self.trajectories.is_dir():
            return []
        return [
            (split.name, int(f.stem), f)
            for split in sorted(p for p in self.trajectories.iterdir() if p.is_dir())
            for f in sorted(split.glob("*.jsonl"))
            if f.stem.isdigit() and (step is None or int(f.stem) == step)
        ]

    @staticmethod
    def trajectory_file_of(path: str | os.PathLike[str]) -> tuple[CheckpointFolder, str, int]:
        """The model folder, split and step of one saved batch's file
        (`{folder}/trajectories/{split}/{step}.jsonl`); a `UsageError` for any other path."""
        p = Path(path)
        if not (p.stem.isdigit() and p.suffix == ".jsonl" and p.parent.parent.name == TRAJECTORIES):
            raise UsageError(
                f"{p} is not a model's {TRAJECTORIES}/{{split}}/{{step}}.jsonl: pass the file "
                "the backend wrote, or the model's folder"
            )
        return CheckpointFolder(p.parent.parent.parent), p.parent.name, int(p.stem)


class CheckpointStore(CheckpointFolder):
    """The on-disk state of one model, as its trainer writes it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.swept = self._sweep()
        """Folders set aside when the store was opened (no valid checkpoint.json)."""

    # ----------------------------------------------------------------- paths
    def trajectories_path(self, split: str, step: int) -> Path:
        """`trajectory_file`, its folder made."""
        path = self.trajectory_file(split, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # ------------------------------------------------------------- checkpoints
    def _sweep(self) -> list[str]:
        """Remove leftover temp folders; set aside folders without a valid marker."""
        aside = []
        for p in self.checkpoints.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)
            elif p.name.isdigit() and self._meta(p) is None:
                aside.append(self._aside(p, f"no valid {MARKER}"))
        return aside

    @staticmethod
    def _aside(p: Path, reason: str) -> str:
        """Rename `p` (a folder or a stray file) out of the way, never deleting it."""
        dest = p.with_name(f"{p.name}.invalid-{int(time.time())}-{uuid.uuid4().hex[:6]}")
        log.warning("checkpoint %s: %s; set aside as %s", p, reason, dest.name)
        os.rename(p, dest)
        return dest.name

    def write(self, step: int, fill: Callable[[Path], None], meta: dict[str, Any]) -> Path:
        """Build checkpoint `step` with `fill(tmp_folder)`, then rename it into place."""
        final = self.path(step)
        if final.exists() or final.is_symlink():
            if self._meta(final) is not None:
                raise UsageError(
                    f"checkpoint {step} already exists at {final}: is another process training "
                    "this model?"
                )
            self._aside(final, "in the way of a new checkpoint, and not a complete one")
        tmp = self._inside(self.checkpoints / f".tmp-{step:04d}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir()
        try:
            fill(tmp)
            marker = {"step": step, "created_at": time.time(), **meta}
            (tmp / MARKER).write_text(json.dumps(marker, indent=2))
            for f in tmp.iterdir():
                if f.is_file():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            _fsync_dir(tmp)
            os.rename(tmp, final)
            _fsync_dir(self.checkpoints)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def set_aside(self, step: int, reason: str) -> str:
        """Rename checkpoint `step` out of the way (kept for inspection); returns its new name."""
        name = self._aside(self.path(step), reason)
        (self.checkpoints / name / "set_aside.txt").write_text(reason + "\n")
        return name

    def delete(self, steps: list[int]) -> None:
        for s in steps:
            p = self.path(s)
            # rename first, so a crash mid-delete never leaves a half checkpoint under its name
            doomed = p.with_name(f".tmp-delete-{p.name}-{uuid.uuid4().hex[:8]}")
            if p.exists():
                os.rename(p, doomed)
                shutil.rmtree(doomed, ignore_errors=True)

    # ----------------------------------------------------------------- history
    def append_history(self, record: dict[str, Any]) -> None:
        append_records(self.history_file, [record])

    def reconcile_history(self) -> list[int]:
        """Append a `train` history line, from its marker's metrics, for every complete
        checkpoint that has none (a process killed between the checkpoint's rename and the
        history append). Returns the steps recovered."""
        have = {h.get("step") for h in self.history() if h.get("split") == "train"}
        missing = [s for s in self.steps() if s not in have]
        for step in missing:
            meta = self.meta(step)
            metrics: dict[str, Any] = meta.get("metrics") or {}
            if not isinstance(metrics, dict):
                metrics = {}
            self.append_history(
                {
                    **metrics,
                    "step": step,
                    "split": "train",
                    "time": meta.get("created_at", time.time()),
                    "recovered": 1.0,
                    **({"request_id": meta["request_id"]} if "request_id" in meta else {}),
                }
            )
        return missing

    def find_request(self, request_id: str) -> tuple[int, dict[str, float]] | None:
        """The step (and its metrics) that a train request with this id committed, if any:
        a client retrying a step whose answer it never got must not train it twice. The
        checkpoints' markers are checked, then the history (a checkpoint may be deleted)."""
        for step in reversed(self.steps()):
            meta = self.meta(step)
            if meta.get("request_id") == request_id:
                return step, dict(meta.get("metrics") or {})
        for h in reversed(self.history()):
            if h.get("request_id") == request_id and h.get("split") == "train":
                metrics = {k: v for k, v in h.items() if isinstance(v, int | float)}
                return int(h["step"]), metrics
        return None
