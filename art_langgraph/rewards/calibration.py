"""How well the RULER judge agrees with human reviewers, on the traces both scored.

`judge_calibration(groups, human)` compares `trajectory.metrics["ruler_score"]` (what
`ruler_score_group` leaves) with a human score per trajectory id (a Langfuse review, see
`art_langgraph.integrations.langfuse.review.calibrate`) and returns a `JudgeCalibration`:

- Spearman's rank correlation over every trajectory that has both scores (ties get their
  average rank, so it is Pearson's correlation of the ranks). The judge's scores are
  relative within a group; pooling groups still answers "does a higher judge score go with
  a higher human score", which is what GRPO relies on.
- Top-pick accuracy: over the groups with at least two such trajectories whose human scores
  are not all equal, the share where the judge's highest-scored trajectory is one of the
  human's best. `top_pick_chance` is what picking at random would score (the mean share of
  human-best trajectories), the floor to compare it with.

The threshold. `MIN_SPEARMAN = 0.5`: below it the judge's ranking explains less than a
quarter of the variance of the humans' ranks (rho squared), conventionally the line between
a moderate and a strong correlation (Cohen's "large" effect is r = 0.5). GRPO trains on the
ranking within each group, so a judge that ranks this poorly trains toward something the
reviewers do not want about as often as not: re-check the rubric or the judge model. Below
`MIN_PAIRS` (5) traces the correlation is too noisy to warn about (at n = 5 even rho = 0.8
is not significant at the 5% level); the record says so instead. A warning is logged and
set in `JudgeCalibration.warning`.

Left out: significance tests and confidence intervals; per-reviewer agreement.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from art_langgraph.trajectories.trajectory import TrajectoryGroup

log = logging.getLogger(__name__)

MIN_SPEARMAN = 0.5
"""Spearman's rho below which the judge is reported as disagreeing with the reviewers."""
MIN_PAIRS = 5
"""Traces with both scores needed before a low rho is warned about."""


class JudgeCalibration(BaseModel):
    """Agreement of the RULER judge with human review on the traces both scored."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    pairs: int = 0
    """Trajectories with both a judge score and a human score."""
    spearman: float | None = None
    """Spearman's rank correlation of judge and human scores over those trajectories; None
    with fewer than 2 of them or when either side gives all the same score."""
    groups: int = 0
    """Groups that count for the top pick: 2+ such trajectories, human scores not all equal."""
    top_pick_hits: int = 0
    """Of those groups, how many had the judge's best among the human's best."""
    top_pick_accuracy: float | None = None
    """top_pick_hits / groups; None without such groups."""
    top_pick_chance: float | None = None
    """The accuracy of a random pick in the same groups (mean share of human-best ones)."""
    threshold: float = MIN_SPEARMAN
    """The rho below which `warning` is set (see the module doc for why this value)."""
    warning: str | None = None
    """Set when rho is below `threshold` with at least `MIN_PAIRS` pairs."""

    def line(self) -> str:
        """One line for a report."""
        rho = "-" if self.spearman is None else f"{self.spearman:.2f}"
        out = f"judge vs human review: Spearman {rho} over {self.pairs} traces"
        if self.groups:
            out += (
                f", judge's top pick is the human's best in {self.top_pick_hits} of "
                f"{self.groups} groups (chance {self.top_pick_chance:.2f})"
            )
        return out


def _ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties given their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho (Pearson's r of average ranks); None when undefined."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def judge_calibration(
    groups: Sequence[TrajectoryGroup],
    human: Mapping[str, float],
    *,
    threshold: float = MIN_SPEARMAN,
) -> JudgeCalibration:
    """Agreement of `metrics["ruler_score"]` with `human` (trajectory id -> human score)
    over the trajectories of `groups` that have both (see the module doc)."""
    judge_all: list[float] = []
    human_all: list[float] = []
    out = JudgeCalibration(threshold=threshold)
    chance: list[float] = []
    for g in groups:
        both = [
            (float(t.metrics["ruler_score"]), float(human[t.id]))
            for t in g.trajectories
            if t.id in human and isinstance(t.metrics.get("ruler_score"), int | float)
        ]
        both = [(j, h) for j, h in both if math.isfinite(j) and math.isfinite(h)]
        judge_all += [j for j, _ in both]
        human_all += [h for _, h in both]
        if len(both) < 2 or len({h for _, h in both}) < 2:
            continue
        best = max(h for _, h in both)
        pick = max(range(len(both)), key=lambda i: both[i][0])  # first of tied judge scores
        out.groups += 1
        out.top_pick_hits += both[pick][1] == best
        chance.append(sum(h == best for _, h in both) / len(both))
    out.pairs = len(judge_all)
    out.spearman = spearman(judge_all, human_all)
    if out.groups:
        out.top_pick_accuracy = out.top_pick_hits / out.groups
        out.top_pick_chance = sum(chance) / len(chance)
    if out.spearman is not None and out.pairs >= MIN_PAIRS and out.spearman < threshold:
        out.warning = (
            f"the RULER judge agrees poorly with human review: Spearman {out.spearman:.2f} "
            f"over {out.pairs} traces, below {threshold:g}; check the rubric or the judge model"
        )
        log.warning("%s", out.warning)
    return out
