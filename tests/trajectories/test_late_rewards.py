"""Late rewards: pending trajectories never train on a placeholder; waiting applies what
arrives and drops the rest after the timeout; a reward that comes after training is an
off-policy update only within max_staleness. The Langfuse reward source:
tests/integrations/langfuse/test_late_rewards.py."""

from __future__ import annotations

import math

import pytest

import art_langgraph as art
from art_langgraph.errors import NonFiniteRewardError
from art_langgraph.training.prepare import prepare_step
from art_langgraph.trajectories.late_rewards import is_pending


def _group(tag: str, n: int = 3, *, pending: bool = True) -> art.TrajectoryGroup:
    trajs = []
    for i in range(n):
        call = art.LLMCall(prompt_token_ids=[1, 2], completion_token_ids=[3 + i])
        traj = art.Trajectory(id=f"{tag}{i}", calls=[call], reward=0.5)
        trajs.append(art.mark_pending(traj) if pending else traj)
    return art.TrajectoryGroup(trajs)


def test_a_pending_trajectory_is_refused_by_the_trainer() -> None:
    with pytest.raises(art.UsageError, match="wait for their reward"):
        prepare_step([_group("a")], art.TrainConfig(), 1)


async def test_what_arrives_is_applied_and_the_rest_dropped_after_the_timeout() -> None:
    calls: list[list[str]] = []

    def fetch(pending: list[art.Trajectory]) -> dict[str, float]:
        calls.append(sorted(t.id for t in pending))
        # a0 arrives at once, a1 on the second poll, a2 never; b0 only of group b
        return {"a0": 1.0, "b0": 0.0} if len(calls) == 1 else {"a1": 0.0}

    groups = [_group("a"), _group("b")]
    result = await art.wait_for_rewards(groups, fetch, timeout_s=0.05, poll_s=0.01)
    assert calls[0] == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert calls[1] == ["a1", "a2", "b1", "b2"]  # asked again only for what is missing
    assert result.arrived == 3 and result.missing == 3
    (a,) = result.groups  # b kept only b0: fewer than two, dropped
    assert [t.id for t in a] == ["a0", "a1"] and a.rewards() == [1.0, 0.0]
    assert result.dropped_groups == 1 and not any(is_pending(t) for t in a)
    assert all(is_pending(t) for g in groups for t in g)  # the inputs are untouched
    prepare_step(result.groups, art.TrainConfig(), 1)  # trainable now


async def test_train_without_keeps_the_fallback_reward() -> None:
    result = await art.wait_for_rewards(
        [_group("c")], lambda p: {"c0": 1.0}, timeout_s=0, on_timeout="train_without"
    )
    (c,) = result.groups
    assert c.rewards() == [1.0, 0.5, 0.5] and result.missing == 2


async def test_an_async_fetch_and_a_nan_reward() -> None:
    async def fetch(pending: list[art.Trajectory]) -> dict[str, float]:
        return {t.id: 1.0 for t in pending}

    result = await art.wait_for_rewards([_group("d")], fetch)
    assert result.arrived == 3 and result.waited_s < 5
    with pytest.raises(NonFiniteRewardError):
        await art.wait_for_rewards([_group("e")], lambda p: {"e0": math.nan})
    with pytest.raises(art.UsageError, match="on_timeout"):
        await art.wait_for_rewards([_group("f")], lambda p: {}, on_timeout="keep")  # type: ignore[arg-type]


def test_a_reward_after_training_is_off_policy_within_max_staleness_only() -> None:
    group = _group("g", pending=False)
    for i, t in enumerate(group):
        t.reward = float(i)
        t.calls[0].adapter_step = 1  # sampled by step 1's adapter
    fresh, m = prepare_step([group], art.TrainConfig(max_staleness=2), 3)
    assert fresh and m["stale_groups"] == 0
    _, m = prepare_step([group], art.TrainConfig(max_staleness=2), 5)
    assert m["stale_groups"] == 1


# ---------------------------------------------------------------- Langfuse as the source
