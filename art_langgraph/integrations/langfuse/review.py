"""Reviews read back from Langfuse: as rewards, and against the judge (extra `langfuse`).

`fetch_scores` reads the scores given to exported traces (by name, source, annotation
queue or data type), through the SDK's v3 scores API. `import_scores` applies them as
rewards: a group with a scored trajectory is *reviewed*, its scored trajectories take the
score as reward (the old one kept in `metrics["reward_before_review"]`, the score in
`metadata["review"]`), and the reviewed groups are ready for `model.train`. Queue reviews:
`review_score` wins over `review_decision` (approve 1, reject 0), both over other names.

`calibrate(folder, queue=...)` compares a queue's reviews with the RULER judge's scores
(art_langgraph/rewards/calibration.py: Spearman's rho, top-pick accuracy, a warning below
rho 0.5), writes `review_calibration.json` in the folder (the art-mcp report shows it)
and, given a dataset run id, scores that run (`judge_spearman`, `judge_top_pick_accuracy`,
each referencing its score config). Those scores are fail-soft: with Langfuse down, slow or
answering an error, a warning is logged and they are recorded as unsent
(`langfuse_scores.jsonl`), and `art-langgraph langfuse export MODEL_DIR` (`export_folder`)
sends them again (`resend_scores`).

Left out: sending rollouts to review (annotation.py); SFT files from reviews (sft.py);
writing scores other than the calibration's.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from art_langgraph.integrations.langfuse.annotation import completed_traces, queue_id_for
from art_langgraph.integrations.langfuse.config import LangfuseConfig
from art_langgraph.integrations.langfuse.folder import append_stamped, latest_unsent, saved_groups
from art_langgraph.integrations.langfuse.scoring import (
    JUDGE_SPEARMAN,
    JUDGE_TOP_PICK_ACCURACY,
    REVIEW_DECISION,
    REVIEW_SCORE,
    SCORE_CONFIGS,
    ScoreConfigClashError,
)
from art_langgraph.integrations.langfuse.sender import Sender
from art_langgraph.integrations.langfuse.traces import trace_id_for
from art_langgraph.rewards.calibration import MIN_SPEARMAN, JudgeCalibration, judge_calibration
from art_langgraph.trajectories.trajectory import Trajectory, TrajectoryGroup, write_jsonl

log = logging.getLogger(__name__)

CALIBRATION_FILE = "review_calibration.json"
"""In the model's folder: the last `calibrate` result (a `JudgeCalibration`)."""
SCORES_FILE = "langfuse_scores.jsonl"
"""In the model's folder: one line per calibration score sent to a dataset run, status
sent or unsent (with the score's body, which `resend_scores` sends again)."""


class ReviewedScore(BaseModel):
    """A score read back from Langfuse."""

    id: str
    """The score's id."""
    trace_id: str | None
    """The trace it scores; None when it scores a session or an experiment."""
    name: str
    """The score's name."""
    value: float | str | bool
    """Its value, as Langfuse stores it for its data type."""
    source: str
    """ANNOTATION, API or EVAL."""
    comment: str | None = None
    """The reviewer's comment."""
    author_user_id: str | None = None
    """Who gave it (annotation scores)."""
    queue_id: str | None = None
    """The annotation queue it was given in."""
    data_type: str | None = None
    """NUMERIC, BOOLEAN, CATEGORICAL, TEXT or CORRECTION (a corrected output)."""
    observation_id: str | None = None
    """The observation it scores, when it scores one (a generation) and not a whole trace."""


class ReviewResult(BaseModel):
    """Trajectories with review scores applied as rewards, and the scores that matched nothing."""

    groups: list[TrajectoryGroup] = Field(default_factory=list)
    """Reviewed groups, rewards replaced by the scores (ready for `model.train`)."""
    applied: int = 0
    """Trajectories whose reward was replaced."""
    dropped: int = 0
    """Unreviewed trajectories left out of reviewed groups (`partial="drop"`)."""
    unmatched: list[ReviewedScore] = Field(default_factory=list)
    """Scores for traces that are not in these trajectories (never exported from here)."""
    unusable: list[ReviewedScore] = Field(default_factory=list)
    """Scores on our traces whose value is not a number (map it with `value_map`)."""
    in_progress: int = 0
    """Queue scores left out because their item is not marked completed yet (`completed_only`)."""


def _score_value(s: ReviewedScore, value_map: dict[str, float] | None) -> float | None:
    if isinstance(s.value, bool):
        return 1.0 if s.value else 0.0
    if isinstance(s.value, int | float):
        return float(s.value) if math.isfinite(s.value) else None
    if value_map and s.value in value_map:
        return float(value_map[s.value])
    return _CATEGORY_VALUES.get(s.name, {}).get(str(s.value))


_CATEGORY_VALUES = {c.name: dict(c.categories) for c in SCORE_CONFIGS if c.categories}
"""Our categorical configs' values (review_decision: approve 1, reject 0), for scores given
with them in a queue; a `value_map` entry overrides."""
_PRECEDENCE = {REVIEW_DECISION: 1, REVIEW_SCORE: 2}
"""Of several usable scores on one trace, the grade wins over the verdict, both over others."""


def fetch_scores(
    *,
    name: str | None = None,
    source: Literal["ANNOTATION", "API", "EVAL"] | None = None,
    queue_id: str | None = None,
    config: LangfuseConfig | None = None,
    page_size: int = 100,
    data_type: str | None = None,
) -> list[ReviewedScore]:
    """Every score matching the filters (all pages), through the SDK's v3 scores API."""
    sender = Sender((config or LangfuseConfig()).resolved())
    out: list[ReviewedScore] = []
    cursor: str | None = None
    try:
        while True:
            page = sender.api.scores.get_many(
                name=name,
                source=source,
                queue_id=queue_id,
                data_type=data_type,
                fields="details,subject,annotation",
                limit=page_size,
                cursor=cursor,
            )
            for s in page.data:
                subject = getattr(s, "subject", None)
                kind = getattr(subject, "kind", None)
                trace_id = (
                    getattr(subject, "id", None)
                    if kind == "trace"
                    else getattr(subject, "trace_id", None)
                )
                out.append(
                    ReviewedScore(
                        id=s.id,
                        trace_id=trace_id,
                        name=s.name,
                        value=getattr(s, "value", None),  # type: ignore[arg-type]
                        source=str(s.source),
                        comment=s.comment,
                        author_user_id=s.author_user_id,
                        queue_id=s.queue_id,
                        data_type=str(s.data_type),
                        observation_id=getattr(subject, "id", None)
                        if kind == "observation"
                        else None,
                    )
                )
            cursor = getattr(page.meta, "cursor", None)
            if not cursor or not page.data:
                return out
    finally:
        sender.close()


def import_scores(
    source_path: str | Path | list[TrajectoryGroup],
    *,
    name: str | None = None,
    source: Literal["ANNOTATION", "API", "EVAL"] | None = "ANNOTATION",
    queue_id: str | None = None,
    value_map: dict[str, float] | None = None,
    partial: Literal["drop", "keep"] = "drop",
    step: int | None = None,
    out: str | Path | None = None,
    config: LangfuseConfig | None = None,
    scores: list[ReviewedScore] | None = None,
    completed_only: bool = True,
) -> ReviewResult:
    """Review scores as rewards. `source_path`: a model folder, a trajectories JSONL file, or
    groups. Scores are fetched by `name` / `source` / `queue_id` (or given as `scores`).
    A group with at least one scored trajectory is *reviewed*: its scored trajectories take
    the score as reward (the old one is kept in `metrics["reward_before_review"]`), and its
    unscored ones are dropped (`partial="drop"`) or keep their reward ("keep"). Unreviewed
    groups are left out. `out`: also write the reviewed groups there (JSONL of groups).
    Queue reviews: `review_decision` counts approve 1 / reject 0 (unless `value_map` says
    otherwise); a trace with several scores takes `review_score`, else `review_decision`,
    else the last by id; corrections (data type CORRECTION) are not rewards and are skipped.
    With `queue_id`, only the reviews of items a reviewer marked completed count
    (`completed_only`; the others may still change, and are counted in `in_progress`);
    `completed_only=False` takes every score given in the queue."""
    if isinstance(source_path, list):
        groups = [g.model_copy(deep=True) for g in source_path]
    else:
        groups = saved_groups(source_path, step)
    if scores is None:
        scores = fetch_scores(name=name, source=source, queue_id=queue_id, config=config)
    result = ReviewResult()
    if queue_id is not None and completed_only:
        done = completed_traces(queue_id, config=config)
        result.in_progress = sum(s.trace_id not in done for s in scores)
        scores = [s for s in scores if s.trace_id in done]
    by_trace: dict[str, Trajectory] = {}
    for g in groups:
        for t in g.trajectories:
            by_trace[str(t.metadata.get("langfuse_trace_id") or trace_id_for(t))] = t
    reviewed: dict[str, ReviewedScore] = {}
    for score in sorted(scores, key=lambda s: (_PRECEDENCE.get(s.name, 0), s.id)):
        target = by_trace.get(score.trace_id or "")
        if score.data_type == "CORRECTION":
            continue  # a corrected output, not a reward: see sft.corrections_sft_file
        if target is None:
            result.unmatched.append(score)
        elif _score_value(score, value_map) is None:
            result.unusable.append(score)
        else:
            reviewed[target.id] = score
    for g in groups:
        if not any(t.id in reviewed for t in g.trajectories):
            continue
        kept = []
        for t in g.trajectories:
            given = reviewed.get(t.id)
            if given is None:
                if partial == "keep":
                    kept.append(t)
                else:
                    result.dropped += 1
                continue
            t.metrics["reward_before_review"] = t.reward
            t.reward = _score_value(given, value_map)  # type: ignore[assignment]
            t.metadata["review"] = given.model_dump(exclude_none=True)
            kept.append(t)
            result.applied += 1
        result.groups.append(g.model_copy(update={"trajectories": kept}))
    if out is not None:
        write_jsonl(out, result.groups)
    return result


# ------------------------------------------------------------------ the judge against the reviews
def calibrate(
    source: str | Path | list[TrajectoryGroup],
    *,
    queue: str,
    dataset_run_id: str | None = None,
    threshold: float = MIN_SPEARMAN,
    config: LangfuseConfig | None = None,
    scores: list[ReviewedScore] | None = None,
    folder: str | Path | None = None,
) -> JudgeCalibration:
    """Agreement of the RULER judge with the reviews given in `queue` (a name or an id) on
    items marked completed, over the trajectories of `source` (a model folder, a trajectories file, or groups).
    A folder gets the result in `review_calibration.json`. With `dataset_run_id`, the
    numbers are also sent as scores of that dataset run (`judge_spearman`,
    `judge_top_pick_accuracy`, each with its score config's id). Logs a warning below
    `threshold`.

    Sending those scores is fail-soft: a Langfuse that is down, slow or answers an error
    is logged, and the scores are recorded as unsent in `folder`'s `langfuse_scores.jsonl`
    (`folder` defaults to `source` when it is a model folder) for `art-langgraph langfuse
    export` to send. Raises when the reviews cannot be read (Langfuse down: there is
    nothing to compare), and `ScoreConfigClashError` for a clashing score config (the
    scores are recorded first)."""
    groups = source if isinstance(source, list) else saved_groups(source)
    qid = None  # given scores are taken as they are
    if scores is None:
        qid = queue_id_for(queue, config=config)
        scores = fetch_scores(queue_id=qid, source="ANNOTATION", config=config)
    reviews = [s for s in scores if s.name in (REVIEW_SCORE, REVIEW_DECISION)]
    # with the queue's id, import_scores keeps the reviews of completed items only
    reviewed = import_scores(groups, scores=reviews, partial="keep", queue_id=qid, config=config)
    human = {
        t.id: t.reward for g in reviewed.groups for t in g.trajectories if "review" in t.metadata
    }
    result = judge_calibration(reviewed.groups, human, threshold=threshold)
    source_folder = None if isinstance(source, list) or not Path(source).is_dir() else Path(source)
    if source_folder is not None:
        (source_folder / CALIBRATION_FILE).write_text(result.model_dump_json(indent=2))
    if dataset_run_id is not None:
        cfg = (config or LangfuseConfig()).resolved()
        bodies = _run_scores(dataset_run_id, result, cfg.environment)
        if bodies:
            target = Path(folder) if folder is not None else source_folder
            sender = Sender(cfg)
            try:
                _send_and_record(bodies, sender, target)
            finally:
                sender.close()
    return result


def _run_scores(
    run_id: str, cal: JudgeCalibration, environment: str | None
) -> list[dict[str, Any]]:
    """The calibration's dataset-run scores, without their config ids (added when sent)."""
    values = {JUDGE_SPEARMAN: cal.spearman, JUDGE_TOP_PICK_ACCURACY: cal.top_pick_accuracy}
    comment = cal.line() + (f"; {cal.warning}" if cal.warning else "")
    return [
        {
            "id": f"{run_id}-{name}",
            "datasetRunId": run_id,
            "name": name,
            "value": value,
            "dataType": "NUMERIC",
            "comment": comment,
            "metadata": {"source": "art_langgraph", "pairs": cal.pairs, "groups": cal.groups},
            **({"environment": environment} if environment else {}),
        }
        for name, value in values.items()
        if value is not None
    ]


def _record(
    folder: Path | None, bodies: list[dict[str, Any]], status: str, error: str = ""
) -> None:
    if folder is None:
        return
    extra = {"error": error} if error else {}
    append_stamped(
        folder / SCORES_FILE,
        [{"id": b["id"], "status": status, "score": b, **extra} for b in bodies],
    )


def _send_and_record(
    bodies: list[dict[str, Any]], sender: Sender, folder: Path | None
) -> str | None:
    """Send the scores with their config ids; record them as sent or unsent. Returns why
    they were not sent, None when they were; raises only for a score config clash."""
    try:
        ids = sender.config_ids()
        sender.send_scores(
            [{**b, "configId": ids[b["name"]]} if b["name"] in ids else b for b in bodies]
        )
    except ScoreConfigClashError as exc:
        _record(folder, bodies, "unsent", str(exc))
        raise
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
        _record(folder, bodies, "unsent", err)
        where = (
            f"recorded for `art-langgraph langfuse export {folder}`"
            if folder is not None
            else "not recorded (no model folder given)"
        )
        log.warning(
            "Langfuse: %d dataset-run scores (%s) not sent (%s); %s",
            len(bodies),
            ", ".join(b["name"] for b in bodies),
            err,
            where,
        )
        return err
    _record(folder, bodies, "sent")
    return None


def resend_scores(folder: str | Path, sender: Sender) -> tuple[int, int]:
    """Send the scores `folder`'s `langfuse_scores.jsonl` records as unsent (the judge
    calibration's); returns (sent, still unsent). Idempotent: a score's id is stable."""
    unsent = latest_unsent(Path(folder) / SCORES_FILE, lambda r: str(r["id"]))
    pending = [r["score"] for r in unsent if "score" in r]
    if not pending:
        return 0, 0
    try:
        err = _send_and_record(pending, sender, Path(folder))
    except ScoreConfigClashError as exc:
        log.warning("Langfuse: %d recorded scores not sent: %s", len(pending), exc)
        return 0, len(pending)
    return (0, len(pending)) if err else (len(pending), 0)
