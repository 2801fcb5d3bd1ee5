"""prepare_step's signal share: what share of a step's rollouts carry a signal, and
`signal_share_scale`, which scales the step's advantages by it (TRL's batch mean)."""

from __future__ import annotations

import pytest

from art_langgraph.training.config import TrainConfig
from art_langgraph.training.prepare import prepare_step
from art_langgraph.trajectories.trajectory import LLMCall, Trajectory, TrajectoryGroup


def _group(tag: int, rewards: list[float]) -> TrajectoryGroup:
    def rollout(i: int, reward: float) -> Trajectory:
        base = 1000 * tag + 10 * i
        call = LLMCall(
            node="agent",
            namespace=["agent"],
            prompt_token_ids=[base, base + 1],
            completion_token_ids=[base + 2, base + 3],
        )
        return Trajectory(id=f"g{tag}t{i}", reward=reward, calls=[call])

    return TrajectoryGroup([rollout(i, r) for i, r in enumerate(rewards)])


def _advantages(config: TrainConfig) -> tuple[dict[str, float], dict[str, float]]:
    groups = [_group(1, [0.0, 1.0]), _group(2, [1.0, 1.0]), _group(3, [0.5, 0.5])]
    seqs, metrics = prepare_step(groups, config, 1)
    return {s.trajectory_id: s.advantage for s in seqs}, metrics


def test_one_group_of_three_with_a_signal_is_a_third_of_the_rollouts() -> None:
    plain, metrics = _advantages(TrainConfig())
    assert metrics["signal_share"] == pytest.approx(1 / 3)
    assert metrics["zero_variance_groups"] == 2
    assert plain == pytest.approx({"g1t0": -1.0, "g1t1": 1.0}, abs=1e-5)  # unscaled by default


def test_the_signal_share_scale_multiplies_every_advantage_by_it() -> None:
    scaled, metrics = _advantages(TrainConfig(signal_share_scale=True))
    assert metrics["signal_share"] == pytest.approx(1 / 3)
    assert scaled == pytest.approx({"g1t0": -1 / 3, "g1t1": 1 / 3}, abs=1e-5)


def test_a_step_where_every_group_carries_a_signal_is_unscaled() -> None:
    groups = [_group(1, [0.0, 1.0]), _group(2, [1.0, 0.0])]
    seqs, metrics = prepare_step(groups, TrainConfig(signal_share_scale=True), 1)
    assert metrics["signal_share"] == 1.0
    assert [s.advantage for s in seqs] == pytest.approx([-1.0, 1.0, 1.0, -1.0], abs=1e-5)


def test_per_token_advantages_are_scaled_too() -> None:
    from art_langgraph.training.prepare import scale_advantages
    from art_langgraph.training.tensorize import TrainSequence

    seq = TrainSequence([1, 2, 3], [False, True, True], [0.0, -1.0, -1.0], 2.0)
    seq.token_advantages = [2.0, 2.0, -4.0]
    half = scale_advantages(seq, 0.5)
    assert half.advantage == 1.0 and half.token_advantages == [1.0, 1.0, -2.0]
    assert seq.token_advantages == [2.0, 2.0, -4.0]  # the original is left as it was
