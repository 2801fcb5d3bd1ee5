"""Langfuse score configs for the scores art_langgraph sends (extra `langfuse`).

A score config fixes a score name's type and range in a Langfuse project, so that the UI
shows it as such, annotators get the right widget, and the server rejects a value out of
range. `ensure_score_configs(api)` creates the configs below, or reuses those that already
exist by name, and returns `{name: config id}`; every score art_langgraph sends carries
its config's id as `configId`: the exporter's (`score_bodies` in traces.py), the dataset
runs' (datasets.py) and the judge calibration's (review.py).

    reward              NUMERIC, no bounds by default: a reward is whatever finite float
                        the user's reward function returns (RULER's is in [0, 1], but a
                        custom reward may be negative or above 1), so a guessed range
                        would make the server reject real rewards. When the range is
                        known, `LangfuseConfig.reward_range` gives it (`score_configs`).
    independent_reward  NUMERIC, the reward before RULER replaced it: the same range.
    ruler_score         NUMERIC [0, 1]: RULER's judge score.
    success             BOOLEAN: reward >= the success threshold (held-out evaluations).
    success_rate        NUMERIC [0, 1]: share of successes over a dataset run.
    review_decision     CATEGORICAL approve=1 / reject=0: a human reviewer's verdict.
    review_score        NUMERIC [0, 1]: a human reviewer's grade.
    judge_spearman      NUMERIC [-1, 1]: Spearman's rho of the judge against the reviews
                        (a dataset-run score, review.py's `calibrate`).
    judge_top_pick_accuracy  NUMERIC [0, 1]: share of groups where the judge's top pick is
                        the reviewers' (a dataset-run score).

A config that exists by name but would reject or misread our scores (another data type, a
range that does not contain ours, missing categories, archived) is a name clash:
`ScoreConfigClashError` says which and how to resolve it. A compatible config made by
someone else (say, `reward` with no bounds) is reused as is; so is an unbounded `reward`
config made before a `reward_range` was given, since it contains that range, while a
bounded one that does not contain the range now given is a clash.

Left out: updating or archiving configs; configs for the user's own score names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from art_langgraph.errors import UsageError
from art_langgraph.integrations.langfuse.client import NO_RETRY, pages

REWARD = "reward"
INDEPENDENT_REWARD = "independent_reward"
RULER_SCORE = "ruler_score"
SUCCESS = "success"
SUCCESS_RATE = "success_rate"
REVIEW_DECISION = "review_decision"
REVIEW_SCORE = "review_score"
JUDGE_SPEARMAN = "judge_spearman"
JUDGE_TOP_PICK_ACCURACY = "judge_top_pick_accuracy"

DataType = Literal["NUMERIC", "BOOLEAN", "CATEGORICAL"]


@dataclass(frozen=True)
class ScoreConfigSpec:
    """One score config as art_langgraph wants it."""

    name: str
    """The score name the config governs (Langfuse: at most 35 characters)."""
    data_type: DataType
    """Langfuse's data type of the scores."""
    description: str
    """Shown in the Langfuse UI next to the score."""
    min_value: float | None = None
    """Lowest accepted value (NUMERIC); None: no bound (-inf)."""
    max_value: float | None = None
    """Highest accepted value (NUMERIC); None: no bound (+inf)."""
    categories: tuple[tuple[str, float], ...] = ()
    """(label, value) of each category (CATEGORICAL)."""


SCORE_CONFIGS: tuple[ScoreConfigSpec, ...] = (
    ScoreConfigSpec(
        REWARD,
        "NUMERIC",
        "art_langgraph: the trajectory's reward, the float the reward function (or RULER) "
        "returned; unbounded because custom rewards may be negative or above 1.",
    ),
    ScoreConfigSpec(
        INDEPENDENT_REWARD,
        "NUMERIC",
        "art_langgraph: the reward before RULER replaced it; unbounded.",
    ),
    ScoreConfigSpec(
        RULER_SCORE,
        "NUMERIC",
        "art_langgraph: RULER's judge score, relative to the other trajectories of the group.",
        0.0,
        1.0,
    ),
    ScoreConfigSpec(
        SUCCESS,
        "BOOLEAN",
        "art_langgraph: the reward reached the success threshold (held-out evaluation).",
    ),
    ScoreConfigSpec(
        SUCCESS_RATE,
        "NUMERIC",
        "art_langgraph: share of a dataset run's items that succeeded.",
        0.0,
        1.0,
    ),
    ScoreConfigSpec(
        REVIEW_DECISION,
        "CATEGORICAL",
        "A reviewer's verdict on a trajectory: approve (train on it) or reject.",
        categories=(("approve", 1.0), ("reject", 0.0)),
    ),
    ScoreConfigSpec(
        REVIEW_SCORE,
        "NUMERIC",
        "A reviewer's grade of a trajectory, 0 (worst) to 1 (best); read back as a reward.",
        0.0,
        1.0,
    ),
    ScoreConfigSpec(
        JUDGE_SPEARMAN,
        "NUMERIC",
        "art_langgraph: Spearman's rank correlation of the RULER judge with the human reviews.",
        -1.0,
        1.0,
    ),
    ScoreConfigSpec(
        JUDGE_TOP_PICK_ACCURACY,
        "NUMERIC",
        "art_langgraph: share of groups where the RULER judge's top pick is the reviewers'.",
        0.0,
        1.0,
    ),
)

_REWARD_SCORES = (REWARD, INDEPENDENT_REWARD)
"""The configs `score_configs(reward_range)` bounds."""


def score_configs(
    reward_range: tuple[float, float] | None = None,
) -> tuple[ScoreConfigSpec, ...]:
    """`SCORE_CONFIGS`, with `reward` and `independent_reward` bounded to `reward_range`
    (min, max) when it is given; None: the range is unknown and they keep no bounds."""
    if reward_range is None:
        return SCORE_CONFIGS
    lo, hi = reward_range
    return tuple(
        replace(
            spec,
            min_value=lo,
            max_value=hi,
            description=spec.description.split(";")[0]
            + f"; range [{lo:g}, {hi:g}] (LangfuseConfig.reward_range).",
        )
        if spec.name in _REWARD_SCORES
        else spec
        for spec in SCORE_CONFIGS
    )


class ScoreConfigClashError(UsageError):
    """A score config of the same name exists in the project and does not fit ours."""

    def __init__(self, name: str, detail: str) -> None:
        self.name = name
        self.detail = detail
        super().__init__(
            f"Langfuse score config {name!r} already exists and {detail}; art_langgraph "
            f"sends {name!r} scores that it would reject or misread. Archive or rename that "
            "config in Langfuse (Settings > Scores), or use another Langfuse project."
        )


def _field(obj: Any, name: str, alias: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(alias, obj.get(name))
    return getattr(obj, name, None)


def _clash(spec: ScoreConfigSpec, existing: Any) -> str | None:
    """Why an existing config cannot take our scores, or None when it can."""
    data_type = str(_field(existing, "data_type", "dataType"))
    if data_type != spec.data_type:
        return f"is {data_type}, not {spec.data_type}"
    if _field(existing, "is_archived", "isArchived"):
        return "is archived"
    if spec.data_type == "NUMERIC":
        lo = _field(existing, "min_value", "minValue")
        hi = _field(existing, "max_value", "maxValue")
        lo = -math.inf if lo is None else float(lo)
        hi = math.inf if hi is None else float(hi)
        want_lo = -math.inf if spec.min_value is None else spec.min_value
        want_hi = math.inf if spec.max_value is None else spec.max_value
        if lo > want_lo or hi < want_hi:
            return f"has the range [{lo}, {hi}], which does not contain [{want_lo}, {want_hi}]"
    if spec.data_type == "CATEGORICAL":
        have = {
            (str(_field(c, "label", "label")), float(_field(c, "value", "value")))
            for c in _field(existing, "categories", "categories") or []
        }
        missing = [
            f"{label}={value:g}" for label, value in spec.categories if (label, value) not in have
        ]
        if missing:
            return f"lacks the categories {', '.join(missing)}"
    return None


def _existing(api: Any) -> dict[str, Any]:
    """Every score config of the project by name (the first of each name, non-archived first)."""
    found: dict[str, Any] = {}
    for c in pages(lambda p: api.score_configs.get(page=p, limit=100, request_options=NO_RETRY)):
        prev = found.get(c.name)
        if prev is None or (prev.is_archived and not c.is_archived):
            found[c.name] = c
    return found


def ensure_score_configs(
    api: Any, specs: tuple[ScoreConfigSpec, ...] = SCORE_CONFIGS
) -> dict[str, str]:
    """Create the score configs art_langgraph uses, or reuse those that exist by name.

    `api` is a `langfuse.api.LangfuseAPI` (or anything with its `score_configs` client).
    Returns `{config name: config id}`. Idempotent: a second call creates nothing. Raises
    `ScoreConfigClashError` when a config of the same name exists with another data type,
    a narrower range, missing categories, or archived; API errors propagate (the caller
    decides whether they are fatal; the exporters treat them as a failed send)."""
    existing = _existing(api)
    ids: dict[str, str] = {}
    for spec in specs:
        have = existing.get(spec.name)
        if have is not None:
            why = _clash(spec, have)
            if why is not None:
                raise ScoreConfigClashError(spec.name, why)
            ids[spec.name] = have.id
            continue
        kwargs: dict[str, Any] = {"description": spec.description}
        if spec.min_value is not None:
            kwargs["min_value"] = spec.min_value
        if spec.max_value is not None:
            kwargs["max_value"] = spec.max_value
        if spec.categories:
            kwargs["categories"] = [{"label": lb, "value": v} for lb, v in spec.categories]
        created = api.score_configs.create(
            name=spec.name,
            data_type=spec.data_type,
            request_options=NO_RETRY,
            **kwargs,
        )
        ids[spec.name] = created.id
    return ids
