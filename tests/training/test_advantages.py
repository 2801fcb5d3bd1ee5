"""Group-relative advantages against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from art_langgraph.errors import UsageError
from art_langgraph.training.advantages import compute_advantages, is_zero_variance


def test_scaled_advantages_exact_values() -> None:
    advantages = compute_advantages([0, 0.25, 1])
    assert [round(a, 5) for a in advantages] == [-0.98058, -0.39223, 1.37281]


def test_unscaled_advantages_exact_values() -> None:
    advantages = compute_advantages([0, 0.25, 1], scale_rewards=False)
    assert [round(a, 5) for a in advantages] == [-0.41667, -0.16667, 0.58333]


def test_scaled_advantages_match_hand_formula() -> None:
    mean = 1.25 / 3
    std = math.sqrt(((0 - mean) ** 2 + (0.25 - mean) ** 2 + (1 - mean) ** 2) / 3)
    expected = [(r - mean) / (std + 1e-6) for r in (0, 0.25, 1)]
    assert compute_advantages([0, 0.25, 1]) == pytest.approx(expected, abs=1e-12)


def test_equal_rewards_give_zero_advantages() -> None:
    assert compute_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert compute_advantages([3.0]) == [0.0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "x", None])
def test_non_finite_reward_names_its_index(bad: object) -> None:
    with pytest.raises(UsageError, match=r"rewards\[2\]"):
        compute_advantages([0.0, 1.0, bad])  # type: ignore[list-item]


def test_empty_rewards_raise() -> None:
    with pytest.raises(UsageError, match="empty"):
        compute_advantages([])


def test_is_zero_variance() -> None:
    assert is_zero_variance([1.0, 1.0, 1.0])
    assert is_zero_variance([1.0, 1.0 + 1e-12])
    assert not is_zero_variance([0.0, 1.0])
    assert not is_zero_variance([0.0, 1e-3], tol=1e-4)
    assert is_zero_variance([0.0, 1e-3], tol=1e-2)
    assert is_zero_variance([])


def test_is_zero_variance_rejects_bad_input() -> None:
    with pytest.raises(UsageError, match=r"rewards\[1\]"):
        is_zero_variance([1.0, math.nan])
    with pytest.raises(UsageError, match="tol"):
        is_zero_variance([1.0], tol=-1.0)
