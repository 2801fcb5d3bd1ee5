"""Group-relative advantages for GRPO, computed from one group's rewards.

`compute_advantages` centres a group's rewards on their mean and (by default) divides by
their population standard deviation, as in the GRPO paper and TRL's `scale_rewards=True`;
`scale_rewards=False` keeps only the centring (Dr. GRPO). `is_zero_variance` tells the
trainer which groups carry no learning signal (every reward equal), so it can skip them.

Left out on purpose: batch-level scaling (std over the whole batch rather than the group),
per-token advantages and their broadcast onto tokens (the trainer's job), and reward
shaping. Plain Python floats in and out, in float64; no torch needed here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from art_langgraph.errors import UsageError

STD_EPS = 1e-6
"""Added to the group's standard deviation before dividing, so equal rewards give 0, not NaN."""


def _finite_rewards(rewards: Sequence[float]) -> list[float]:
    """Return the rewards as floats; raise `UsageError` naming the first bad index."""
    values: list[float] = []
    for i, reward in enumerate(rewards):
        try:
            value = float(reward)
        except (TypeError, ValueError):
            raise UsageError(
                f"rewards[{i}] is {reward!r}, not a number; every reward must be a finite float"
            ) from None
        if not math.isfinite(value):
            raise UsageError(
                f"rewards[{i}] is {value!r}; every reward must be a finite float "
                "(drop or fix the trajectory before computing advantages)"
            )
        values.append(value)
    return values


def compute_advantages(rewards: Sequence[float], scale_rewards: bool = True) -> list[float]:
    """Return one advantage per reward of a single group: `(r - mean) / (std + 1e-6)`.

    Args:
        rewards: the rewards of the rollouts of one prompt (one GRPO group), in order.
        scale_rewards: divide by the group's population standard deviation (plus
            `STD_EPS`); `False` leaves the division out and returns `r - mean`.

    Raises:
        UsageError: `rewards` is empty, or one of them is NaN, infinite or not a number
            (the message names its index).
    """
    values = _finite_rewards(rewards)
    if not values:
        raise UsageError("rewards is empty; a group needs at least one reward")
    mean = math.fsum(values) / len(values)
    centred = [v - mean for v in values]
    if not scale_rewards:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / len(values))  # population std
    return [c / (std + STD_EPS) for c in centred]


def is_zero_variance(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """Whether every reward of the group is equal (max - min <= `tol`).

    Such a group gives every rollout a zero advantage, so the trainer skips it. An empty
    group counts as zero-variance (there is nothing to learn from it).

    Raises:
        UsageError: a reward is NaN, infinite or not a number, or `tol` is negative.
    """
    if tol < 0:
        raise UsageError(f"tol is {tol}; it must be >= 0")
    values = _finite_rewards(rewards)
    if not values:
        return True
    return max(values) - min(values) <= tol
