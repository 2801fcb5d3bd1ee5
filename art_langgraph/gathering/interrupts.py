"""Trajectories that outlive a process: runs that stop at a LangGraph `interrupt()`.

A graph that asks a human for approval stops at `interrupt()`; its checkpointer keeps the
thread, and the run goes on later, perhaps in another process, with
`graph.invoke(Command(resume=...), config)`. `capture(thread=config, store=folder)` keeps
the trajectory with it: a run that stops at an interrupt is saved here under its thread id
(`ThreadStore.save`), and the capture that resumes that thread loads it and records into the
same trajectory, so the calls before and after the approval train as one rollout. The
file is removed when the run finishes.

`resume_reward` maps the values a run was resumed with (approve / reject / edit, in the
common shapes: booleans, words, `{"type": ...}` as LangGraph's agent inbox sends, lists
of those) to a reward: human approval as a reward source.

Left out: locking between processes that resume the same thread at once (LangGraph's
checkpointer does not allow that either), and storing trajectories inside the
checkpointer's own tables (its schema is the saver's, and differs between savers).
"""

from __future__ import annotations

import hashlib
import os
import re
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from art_langgraph.errors import UsageError
from art_langgraph.trajectories.trajectory import Trajectory
from art_langgraph.utils import atomic_write

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

_APPROVE = frozenset({"approve", "approved", "accept", "accepted", "yes", "y", "ok", "continue"})
_REJECT = frozenset({"reject", "rejected", "deny", "denied", "no", "n", "ignore", "cancel"})
_EDIT = frozenset({"edit", "edited", "response", "respond", "modify", "modified"})
_KIND_KEYS = ("type", "action", "decision")


def thread_id_of(thread: str | Mapping[str, Any]) -> str:
    """The thread id of a LangGraph config (`{"configurable": {"thread_id": ...}}`), or
    `thread` itself when it is a string."""
    if isinstance(thread, str):
        tid: Any = thread
    elif isinstance(thread, Mapping):
        tid = (thread.get("configurable") or {}).get("thread_id")
    else:
        raise UsageError(
            f"thread= takes a thread id or a LangGraph config, not {type(thread).__name__}"
        )
    if tid is None or str(tid) == "":
        raise UsageError(
            'this config has no thread id: pass {"configurable": {"thread_id": ...}}, '
            "as LangGraph's checkpointer needs too"
        )
    return str(tid)


class ThreadStore:
    """A folder of the trajectories of runs waiting at an interrupt, one JSON file per thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def file(self, thread_id: str) -> Path:
        """Where `thread_id`'s trajectory is kept: a name made safe (no separators, no
        leading dots can escape the folder) plus a hash, so two ids never share a file."""
        digest = hashlib.sha256(thread_id.encode()).hexdigest()[:12]
        readable = _SAFE.sub("_", thread_id)[:64].lstrip(".")
        return self.path / f"{readable}-{digest}.json"

    def load(self, thread_id: str) -> Trajectory | None:
        """The saved trajectory of `thread_id`, or None when none is waiting."""
        file = self.file(thread_id)
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            return Trajectory.model_validate_json(text)
        except ValueError as exc:
            raise UsageError(
                f"{file}: not a saved trajectory of thread {thread_id!r}: {exc}"
            ) from exc

    def save(self, thread_id: str, trajectory: Trajectory) -> Path:
        """Write `trajectory` as `thread_id`'s (atomically: a crash leaves the old file or the
        new one, never half of one); returns the file."""
        self.path.mkdir(parents=True, exist_ok=True)
        file = self.file(thread_id)
        with atomic_write(file) as f:
            f.write(trajectory.model_dump_json())
        return file

    def discard(self, thread_id: str) -> None:
        """Forget `thread_id`'s trajectory (its run finished); nothing when there is none."""
        self.file(thread_id).unlink(missing_ok=True)

    def waiting(self) -> list[Trajectory]:
        """Every saved trajectory: the runs waiting at an interrupt, oldest first."""
        found = [t for f in sorted(self.path.glob("*.json")) if (t := _read(f)) is not None]
        return sorted(found, key=lambda t: t.started_at)


def _read(file: Path) -> Trajectory | None:
    try:
        return Trajectory.model_validate_json(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _kind(value: Any, approve: float, reject: float, edit: float) -> float:
    if isinstance(value, bool):
        return approve if value else reject
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _APPROVE:
            return approve
        if word in _REJECT:
            return reject
        if word in _EDIT:
            return edit
    elif isinstance(value, Mapping):
        for key in _KIND_KEYS:
            if key in value:
                return _kind(value[key], approve, reject, edit)
        if isinstance(value.get("approved"), bool):
            return approve if value["approved"] else reject
        if len(value) == 1:  # {interrupt_id: value}, as Command(resume={id: ...}) sends
            return _kind(next(iter(value.values())), approve, reject, edit)
    elif isinstance(value, list) and value:
        return statistics.fmean(_kind(v, approve, reject, edit) for v in value)
    raise UsageError(
        f"cannot read a decision from the resume value {value!r}: give True/False, "
        '"approve"/"reject"/"edit" (or accept/ignore/response), {"type": ...}, '
        '{"approved": bool}, or a list of those'
    )


def resume_reward(
    source: Trajectory | Any,
    *,
    approve: float = 1.0,
    reject: float = 0.0,
    edit: float = 0.5,
) -> float:
    """A reward from a human's decisions at `interrupt()`: `approve` for an approval,
    `reject` for a rejection, `edit` for an edit (the action was changed before it ran).

    `source` is a resume value or a Trajectory, whose `resume_values` are averaged (a run
    approved once and rejected once gets their mean). A value may be a bool; a word
    (approve/approved/accept/yes/ok, reject/rejected/deny/no/ignore/cancel,
    edit/edited/response); a dict with "type", "action" or "decision" holding one of those
    (LangGraph's agent inbox sends `{"type": "accept" | "edit" | "response" | "ignore"}`;
    "response", feedback instead of the action, counts as an edit), or with "approved"
    holding a bool; `{interrupt_id: value}`; or a list of those (their mean).

    Raises:
        UsageError: a value that is none of these, or a trajectory never resumed.
    """
    if isinstance(source, Trajectory):
        if not source.resume_values:
            raise UsageError(
                f"trajectory {source.id!r} was never resumed from an interrupt: no decision "
                "to read (was it captured with capture(thread=..., store=...)?)"
            )
        return statistics.fmean(_kind(v, approve, reject, edit) for v in source.resume_values)
    return _kind(source, approve, reject, edit)
