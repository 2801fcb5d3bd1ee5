"""Promotion gated on evaluation: which step a model's bare name serves.

With `ModelConfig.promote_on_evaluation`, a request for `name` is served by the
*promoted* step instead of the latest; `name@latest` always names the latest step (the
training rollouts ask for it: `model.chat_model()`, `model.openai_client()`), and
`name@N` is step N as ever. The response's `model` says `name@step` either way.

A step is promoted when its held-out evaluation, recorded with `await
model.record_evaluation(step, score)`, is at least the promoted step's score minus
`ModelConfig.promotion_tolerance` (`decide`). By hand: `art-langgraph promote NAME STEP`,
and `art-langgraph rollback NAME` goes back to the step promoted before the current one.

Decisions live in the model's folder as `promotion.jsonl`, one `PromotionDecision` per
line (step, score, promoted or not, the step served after it, reason, time). Each
change rewrites the file through a temp file renamed into place (a crash leaves the old
history or the new one, never half a line) under a lock file (`.promotion.lock`), so
the CLI and a running server never lose each other's lines. The step served is the last
line's `served`; a server re-reads the file when it changes (one `stat` per request for
the bare name), which is how the CLI takes effect on a live server without an API of its
own: the folder is the one source of truth, for `LocalBackend` embedded in an app as for
the backend server.

Left out: several metrics or significance tests per decision; the comparison is always
with the promoted step's score, so a run of promotions each within the tolerance may
drift down by more than it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from art_langgraph.errors import UsageError
from art_langgraph.trajectories.records import read_records, write_records

log = logging.getLogger(__name__)

FILE = "promotion.jsonl"
_LOCK = ".promotion.lock"


class PromotionDecision(BaseModel):
    """One line of `promotion.jsonl`: what was decided about a step, and why."""

    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)

    action: Literal["start", "evaluation", "promote", "rollback"]
    """start: promotion was turned on (the latest step then is promoted); evaluation: a
    held-out score came in (`record_evaluation`); promote, rollback: by hand (the CLI)."""
    step: int
    """The step decided about (for a rollback: the step served again)."""
    score: float | None
    """Its held-out score (None where none is known)."""
    promoted: bool
    """Whether `step` is the promoted step after this decision."""
    served: int
    """The step the bare name serves after this decision."""
    reason: str
    """Why, with the numbers compared."""
    time: float
    """Unix time of the decision."""


def decide(
    history: list[PromotionDecision], step: int, score: float, tolerance: float
) -> PromotionDecision:
    """The decision on an evaluation of `step` scoring `score`, given the decisions so far.

    Promoted when `score >= promoted score - tolerance`; the promoted step's score is its
    latest recorded one. A step older than the promoted one is recorded, never promoted
    (only the CLI goes back); a score for the promoted step itself updates its score; a
    promoted step never evaluated is replaced by any evaluated step."""
    if not math.isfinite(score):
        raise UsageError(f"an evaluation score must be a finite number, got {score!r}")
    served = _stack(history)[-1] if history else 0
    best = _score_of(history, served)
    now = time.time()

    def out(promoted: bool, reason: str) -> PromotionDecision:
        return PromotionDecision(
            action="evaluation",
            step=step,
            score=score,
            promoted=promoted,
            served=step if promoted else served,
            reason=reason,
            time=now,
        )

    if step == served:
        return out(True, f"step {step} is the promoted step; its score is now {score:.4g}")
    if step < served:
        return out(
            False,
            f"step {step} is older than the promoted step {served}: recorded, not promoted "
            "(art-langgraph promote serves an older step)",
        )
    if best is None:
        return out(True, f"the promoted step {served} has no score to compare with")
    bar = best - tolerance
    if score >= bar:
        return out(
            True,
            f"score {score:.4g} >= {bar:.4g} (step {served}'s {best:.4g} - tolerance {tolerance:g})",
        )
    return out(
        False,
        f"score {score:.4g} < {bar:.4g} (step {served}'s {best:.4g} - tolerance {tolerance:g}): "
        f"step {served} stays promoted",
    )


def _stack(history: list[PromotionDecision]) -> list[int]:
    """The promoted steps, oldest first, replayed from the decisions (rollback pops)."""
    stack: list[int] = []
    for d in history:
        if d.action == "rollback":
            if stack:
                stack.pop()
            if not stack or stack[-1] != d.served:
                stack.append(d.served)
        elif d.promoted and (not stack or stack[-1] != d.step):
            stack.append(d.step)
    return stack


def _score_of(history: list[PromotionDecision], step: int) -> float | None:
    for d in reversed(history):
        if d.step == step and d.score is not None:
            return d.score
    return None


class PromotionLog:
    """The promotion history of one model's folder (`promotion.jsonl`)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.file = self.folder / FILE
        self._seen: tuple[int, int, int] | None = None
        self._served: int | None = None
        self._read_lock = threading.Lock()

    # ---------------------------------------------------------------- reading
    def history(self) -> list[PromotionDecision]:
        return read_records(self.file, PromotionDecision, missing_ok=True)

    def served(self) -> int | None:
        """The promoted step (None: no decision yet), re-read only when the file changed."""
        try:
            st = self.file.stat()
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._read_lock:
            if key != self._seen:
                history = self.history()
                self._served = history[-1].served if history else None
                self._seen = key
            return self._served

    # ---------------------------------------------------------------- writing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[PromotionDecision]]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / _LOCK, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield self.history()
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _write(self, history: list[PromotionDecision], decision: PromotionDecision) -> None:
        write_records(self.file, [*history, decision])

    def start(self, latest: int) -> PromotionDecision | None:
        """Promote `latest` if no decision was ever made (promotion just turned on): the
        bare name keeps serving what it served until an evaluation decides."""
        with self._locked() as history:
            if history:
                return None
            d = PromotionDecision(
                action="start",
                step=latest,
                score=None,
                promoted=True,
                served=latest,
                reason=f"promotion turned on: the latest step {latest} is promoted until an "
                "evaluation decides",
                time=time.time(),
            )
            self._write(history, d)
            return d

    def record_evaluation(
        self, step: int, score: float, tolerance: float, steps: Iterable[int]
    ) -> PromotionDecision:
        """Decide on `step`'s evaluation (`decide`) and record it; `steps`: those that exist."""
        _check_step(step, steps, self.folder)
        with self._locked() as history:
            d = decide(history, step, float(score), tolerance)
            self._write(history, d)
            return d

    def promote(self, step: int, steps: Iterable[int]) -> PromotionDecision:
        """Serve `step` as the bare name, whatever its score (by hand)."""
        _check_step(step, steps, self.folder)
        with self._locked() as history:
            d = PromotionDecision(
                action="promote",
                step=step,
                score=_score_of(history, step),
                promoted=True,
                served=step,
                reason=f"promoted by hand (was step {_stack(history)[-1] if history else 'none'})",
                time=time.time(),
            )
            self._write(history, d)
            return d

    def rollback(self, steps: Iterable[int]) -> PromotionDecision:
        """Serve again the step promoted before the current one."""
        with self._locked() as history:
            stack = _stack(history)
            if len(stack) < 2:
                now = f"step {stack[-1]} is" if stack else "no step is"
                raise UsageError(
                    f"nothing to roll back to in {self.folder.name}: {now} promoted and none "
                    "before it (art-langgraph promote NAME STEP serves any step)"
                )
            current, back = stack[-1], stack[-2]
            _check_step(back, steps, self.folder)
            d = PromotionDecision(
                action="rollback",
                step=back,
                score=_score_of(history, back),
                promoted=True,
                served=back,
                reason=f"rolled back by hand from step {current}",
                time=time.time(),
            )
            self._write(history, d)
            return d


def _check_step(step: int, steps: Iterable[int], folder: Path) -> None:
    known = sorted({0, *steps})  # step 0: the base model, always served
    if not isinstance(step, int) or isinstance(step, bool) or step not in known:
        raise UsageError(
            f"model {folder.name!r} has no checkpoint for step {step!r} "
            f"(steps: {', '.join(map(str, known))})"
        )
