"""Human review of exported rollouts in a Langfuse annotation queue (extra `langfuse`).

`send_to_review(groups, queue="...", fraction=0.1)` puts a sample of exported rollouts
(their traces) in an annotation queue, made on first use and tied to the
`review_decision` (approve/reject) and `review_score` (0..1) score configs (scoring.py).
The sample (`review_sample`), deduplicated, is the union of:

- the `disagreements` rollouts where the judge and the reward disagree most: largest
  |metrics["ruler_score"] - metrics["independent_reward"]|, over those that have both
  and a gap above 0;
- the rollouts nearest their group's median reward, the borderline ones: in each group
  whose rewards are not all equal, the one closest to the median; `near_median` of those
  groups, in seeded order;
- a fixed `fraction` of all rollouts, ceil(fraction * n), chosen by a seeded hash of the
  trajectory id, so the same rollouts and seed give the same sample in any order.

Ties are broken by the same seeded hash. A rollout already in the queue is not added again.
A queue of that name tied to other score configs is a `ReviewQueueClashError`. Fail-soft:
with Langfuse down, slow or answering an error, one warning is logged and the items not
sent are recorded as such in the model's folder (`langfuse_review.jsonl`);
`art-langgraph langfuse export MODEL_DIR` (`export_folder`) sends them again
(`resend_review_items`).

Completed reviews are scores with the queue's id (`queue_id_for(name)`): review.py reads
them back (`import_scores`, `calibrate`); sft.py turns approvals and corrections into SFT
files.

Left out: queue assignments to users; observation- or session-level queue items; deleting
items.
"""

from __future__ import annotations

import hashlib
import logging
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from langfuse.api import NotFoundError
from pydantic import BaseModel, ConfigDict, Field

from art_langgraph.errors import UsageError
from art_langgraph.integrations.langfuse.client import NO_RETRY, pages
from art_langgraph.integrations.langfuse.config import LangfuseConfig
from art_langgraph.integrations.langfuse.folder import (
    append_stamped,
    latest_unsent,
    trajectory_files,
)
from art_langgraph.integrations.langfuse.scoring import (
    REVIEW_DECISION,
    REVIEW_SCORE,
    SCORE_CONFIGS,
    ScoreConfigClashError,
    ensure_score_configs,
)
from art_langgraph.integrations.langfuse.sender import Sender
from art_langgraph.integrations.langfuse.traces import trace_id_for
from art_langgraph.trajectories.records import is_finite_number
from art_langgraph.trajectories.trajectory import Trajectory, TrajectoryGroup, read_groups

log = logging.getLogger(__name__)

REVIEW_FILE = "langfuse_review.jsonl"
"""In the model's folder: one line per rollout picked for review, status sent or unsent."""
_warned: set[str] = set()
_REVIEW_CONFIGS = tuple(c for c in SCORE_CONFIGS if c.name in (REVIEW_DECISION, REVIEW_SCORE))
"""The configs a queue is tied to; only these are made here, so a queue never checks the
`reward` config against a range it does not know (`LangfuseConfig.reward_range`)."""


class ReviewQueueClashError(UsageError):
    """An annotation queue of that name exists and is not tied to the review score configs."""

    def __init__(self, queue: str, queue_id: str, has: list[str], wants: list[str]) -> None:
        self.queue, self.queue_id, self.has, self.wants = queue, queue_id, has, wants
        super().__init__(
            f"Langfuse annotation queue {queue!r} ({queue_id}) exists with score configs "
            f"{has}, without the review configs {wants} ({REVIEW_DECISION!r}, {REVIEW_SCORE!r}) "
            "whose scores art_langgraph reads back as rewards; pick another queue name, or add "
            "those score configs to the queue in Langfuse"
        )


class ReviewPick(BaseModel):
    """One rollout picked for review, and why."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    trajectory_id: str
    """The trajectory."""
    trace_id: str
    """Its Langfuse trace, the queue item's object."""
    group: int
    """Index of its group in the groups given."""
    reasons: list[Literal["disagreement", "median", "fraction"]] = Field(default_factory=list)
    """Which rules picked it (see the module doc)."""


class ReviewReport(BaseModel):
    """What one `send_to_review` did."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    queue: str
    """The queue's name."""
    queue_id: str | None = None
    """Its id; None when Langfuse could not be reached."""
    picks: list[ReviewPick] = Field(default_factory=list)
    """The sample."""
    sent: int = 0
    """Items added to the queue."""
    already: int = 0
    """Picks that were in the queue already."""
    unsent: int = 0
    """Picks not sent (recorded in the folder for re-sending, when one was given)."""
    error: str | None = None
    """Why some were not sent."""


# ------------------------------------------------------------------ the sample
def _key(seed: int, trajectory_id: str) -> str:
    return hashlib.sha256(f"{seed}/{trajectory_id}".encode()).hexdigest()


def review_sample(
    groups: Sequence[TrajectoryGroup],
    *,
    fraction: float = 0.1,
    disagreements: int = 2,
    near_median: int = 2,
    seed: int = 0,
) -> list[ReviewPick]:
    """The rollouts to review (the rule is in the module doc): disagreement picks first,
    then median picks, then the fraction, each rollout once with all its reasons."""
    if not 0 <= fraction <= 1 or disagreements < 0 or near_median < 0:
        raise UsageError(
            f"fraction must be in [0, 1] and the counts >= 0; got fraction={fraction}, "
            f"disagreements={disagreements}, near_median={near_median}"
        )
    members = [(gi, t) for gi, g in enumerate(groups) for t in g.trajectories]
    picks: dict[str, ReviewPick] = {}

    def pick(gi: int, t: Trajectory, reason: Any) -> None:
        p = picks.setdefault(
            t.id,
            ReviewPick(
                trajectory_id=t.id,
                trace_id=str(t.metadata.get("langfuse_trace_id") or trace_id_for(t)),
                group=gi,
            ),
        )
        if reason not in p.reasons:
            p.reasons.append(reason)

    gaps = []
    for gi, t in members:
        judge, own = t.metrics.get("ruler_score"), t.metrics.get("independent_reward")
        if is_finite_number(judge) and is_finite_number(own) and abs(float(judge) - float(own)) > 0:  # type: ignore[arg-type]
            gaps.append((-abs(float(judge) - float(own)), _key(seed, t.id), gi, t))  # type: ignore[arg-type]
    for _, _, gi, t in sorted(gaps, key=lambda x: x[:2])[:disagreements]:
        pick(gi, t, "disagreement")

    borderline = []
    for gi, g in enumerate(groups):
        rewards = [t.reward for t in g.trajectories]
        if len(rewards) < 2 or len(set(rewards)) < 2:
            continue
        median = statistics.median(rewards)
        t = min(g.trajectories, key=lambda t: (abs(t.reward - median), _key(seed, t.id)))
        borderline.append((_key(seed, t.id), gi, t))
    for _, gi, t in sorted(borderline, key=lambda x: x[0])[:near_median]:
        pick(gi, t, "median")

    n = math.ceil(fraction * len(members))
    for gi, t in sorted(members, key=lambda m: _key(seed, m[1].id))[:n]:
        pick(gi, t, "fraction")
    return list(picks.values())


# ------------------------------------------------------------------ the queue
def _find_queue(api: Any, name: str) -> Any:
    queues = pages(
        lambda p: api.annotation_queues.list_queues(page=p, limit=100, request_options=NO_RETRY)
    )
    return next((q for q in queues if q.name == name), None)


def ensure_queue(api: Any, name: str, *, description: str | None = None) -> str:
    """The id of annotation queue `name`, made (tied to the review score configs, which are
    made too) when missing. `api`: a `langfuse.api.LangfuseAPI`. Raises
    `ReviewQueueClashError` when the queue exists without those configs."""
    ids = ensure_score_configs(api, _REVIEW_CONFIGS)
    wants = [ids[REVIEW_DECISION], ids[REVIEW_SCORE]]
    found = _find_queue(api, name)
    if found is not None:
        if not set(wants) <= set(found.score_config_ids):
            raise ReviewQueueClashError(name, found.id, list(found.score_config_ids), wants)
        return str(found.id)
    made = api.annotation_queues.create_queue(
        name=name,
        score_config_ids=wants,
        description=description
        or "art_langgraph rollouts to review: approve/reject and/or grade 0..1; read back as rewards",
        request_options=NO_RETRY,
    )
    return str(made.id)


def queue_id_for(queue: str, *, config: LangfuseConfig | None = None) -> str:
    """The id of the annotation queue named `queue`; `queue` itself when no queue has that
    name (it is taken for an id)."""
    sender = Sender((config or LangfuseConfig()).resolved())
    try:
        found = _find_queue(sender.api, queue)
    finally:
        sender.close()
    return str(found.id) if found is not None else queue


def completed_traces(queue_id: str, *, config: LangfuseConfig | None = None) -> set[str]:
    """The traces of the queue's items a reviewer marked completed ("Complete + next" in
    Langfuse's UI): their reviews are final, where an item still pending may be rescored."""
    sender = Sender((config or LangfuseConfig()).resolved())
    try:
        items = pages(
            lambda p: sender.api.annotation_queues.list_queue_items(
                queue_id, status="COMPLETED", page=p, limit=100, request_options=NO_RETRY
            )
        )
        return {str(i.object_id) for i in items}
    except NotFoundError as exc:
        raise UsageError(
            f"Langfuse has no annotation queue with id {queue_id!r}: name the queue by its "
            "name or id (completed_only=False, --include-in-progress, takes its scores "
            "without asking which items are completed)"
        ) from exc
    finally:
        sender.close()


def _queued(api: Any, queue_id: str) -> set[str]:
    items = pages(
        lambda p: api.annotation_queues.list_queue_items(
            queue_id, page=p, limit=100, request_options=NO_RETRY
        )
    )
    return {i.object_id for i in items}


def _record(folder: Path | None, queue: str, rows: list[dict[str, Any]]) -> None:
    if folder is not None:
        append_stamped(Path(folder) / REVIEW_FILE, [{"queue": queue, **r} for r in rows])


def _send(
    sender: Sender, queue: str, items: list[dict[str, Any]], report: ReviewReport
) -> list[dict[str, Any]]:
    """Add `items` (dicts with trace_id) to the queue; returns the records to append."""
    done: list[dict[str, Any]] = []
    try:
        report.queue_id = ensure_queue(sender.api, queue)
        queued = _queued(sender.api, report.queue_id)
        for item in items:
            if item["trace_id"] in queued:
                report.already += 1
            else:
                sender.api.annotation_queues.create_queue_item(
                    report.queue_id,
                    object_id=item["trace_id"],
                    object_type="TRACE",
                    request_options=NO_RETRY,
                )
                report.sent += 1
                queued.add(item["trace_id"])
            done.append({**item, "status": "sent"})
    except (ReviewQueueClashError, ScoreConfigClashError):
        raise
    except Exception as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        report.unsent = len(items) - len(done)
        if queue not in _warned:
            _warned.add(queue)
            log.warning(
                "Langfuse review queue %r: %d rollouts not sent (%s). Training goes on; "
                "`art-langgraph langfuse export MODEL_DIR` sends them later.",
                queue,
                report.unsent,
                report.error,
            )
        else:
            log.debug("Langfuse review queue %r failed again: %s", queue, report.error)
        done += [{**item, "status": "unsent"} for item in items[len(done) :]]
    return done


def send_to_review(
    groups: Sequence[TrajectoryGroup],
    *,
    queue: str,
    fraction: float = 0.1,
    disagreements: int = 2,
    near_median: int = 2,
    seed: int = 0,
    folder: str | Path | None = None,
    split: str | None = None,
    step: int | None = None,
    config: LangfuseConfig | None = None,
) -> ReviewReport:
    """Add a sample of these (exported) rollouts to annotation queue `queue` (see the module
    doc for the sample, the queue and what happens when Langfuse fails). `folder`: the
    model's folder, where picks are recorded (unsent ones are re-sent by `export_folder`);
    `split`/`step` label those records. Raises only on misuse: no Langfuse keys, bad
    sample arguments, a clashing queue or score config."""
    picks = review_sample(
        groups, fraction=fraction, disagreements=disagreements, near_median=near_median, seed=seed
    )
    report = ReviewReport(queue=queue, picks=picks)
    if not picks:
        return report
    sender = Sender((config or LangfuseConfig()).resolved())
    items = [
        {
            "trace_id": p.trace_id,
            "trajectory_id": p.trajectory_id,
            "reasons": p.reasons,
            "split": split,
            "step": step,
        }
        for p in picks
    ]
    try:
        records = _send(sender, queue, items, report)
    finally:
        sender.close()
    _record(Path(folder) if folder is not None else None, queue, records)
    return report


def review_folder(
    folder: str | Path,
    *,
    queue: str,
    split: str = "train",
    step: int | None = None,
    config: LangfuseConfig | None = None,
    **sample: Any,
) -> list[ReviewReport]:
    """`send_to_review` over a model folder's saved trajectories, one sample per saved step
    of `split` (or only `step`); `sample`: fraction, disagreements, near_median, seed."""
    folder = Path(folder)
    reports = []
    for s, n, path in trajectory_files(folder, step):
        if s == split:
            groups = read_groups(path)
            reports.append(
                send_to_review(
                    groups, queue=queue, folder=folder, split=s, step=n, config=config, **sample
                )
            )
    return reports


def check_queue(queue: str, *, config: LangfuseConfig | None = None) -> str | None:
    """Make sure the queue can be used before a run starts: its id, or None (and a warning)
    when Langfuse cannot be reached. Raises on misuse: no keys, a clashing queue."""
    sender = Sender((config or LangfuseConfig()).resolved())
    try:
        return ensure_queue(sender.api, queue)
    except (ReviewQueueClashError, ScoreConfigClashError):
        raise
    except Exception as exc:
        log.warning(
            "Langfuse review queue %r could not be checked (%s: %s); rollouts picked for "
            "review are recorded and sent later",
            queue,
            type(exc).__name__,
            exc,
        )
        return None
    finally:
        sender.close()


def resend_review_items(
    folder: str | Path, *, config: LangfuseConfig | None = None, sender: Sender | None = None
) -> tuple[int, int]:
    """Send the picks `send_to_review` recorded as unsent in `folder`; returns (sent, still
    unsent). Picks already in the queue count as sent. `sender`: an open one to reuse (it
    stays open), else one is made from `config`."""
    pending: dict[str, list[dict[str, Any]]] = {}
    for rec in latest_unsent(Path(folder) / REVIEW_FILE, lambda r: (r["queue"], r["trace_id"])):
        item = {k: v for k, v in rec.items() if k not in ("queue", "status", "time")}
        pending.setdefault(rec["queue"], []).append(item)
    if not pending:
        return 0, 0
    sent = unsent = 0
    own = sender is None
    active = Sender((config or LangfuseConfig()).resolved()) if sender is None else sender
    try:
        for queue, items in pending.items():
            report = ReviewReport(queue=queue)
            records = _send(active, queue, items, report)
            _record(Path(folder), queue, [r for r in records if r["status"] == "sent"])
            sent += report.sent + report.already
            unsent += report.unsent
    finally:
        if own:
            active.close()
    return sent, unsent
