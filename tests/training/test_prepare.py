"""prepare_step's signal share: what share of a step's rollouts carry a signal, and
`signal_share_scale`, which scales the step's advantages by it (TRL's batch mean); and
`flat_groups='batch_baseline'`, which trains groups of one reward against the step's mean;
and identical rollouts trained once, weighed by their count."""

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


def test_a_batch_baseline_trains_flat_groups_against_the_step_mean() -> None:
    advantages, metrics = _advantages(TrainConfig(flat_groups="batch_baseline"))
    # the step's rewards: 0, 1, 1, 1, 0.5, 0.5 -> mean 2/3, population std sqrt(5/36)
    std = (5 / 36) ** 0.5
    assert advantages == pytest.approx(
        {
            "g1t0": -1.0,  # a group that differs keeps its own advantages
            "g1t1": 1.0,
            "g2t0": (1 - 2 / 3) / std,
            "g2t1": (1 - 2 / 3) / std,
            "g3t0": (0.5 - 2 / 3) / std,
            "g3t1": (0.5 - 2 / 3) / std,
        },
        abs=1e-4,
    )
    assert metrics["flat_groups_trained"] == 2 and metrics["zero_variance_groups"] == 0
    assert metrics["signal_share"] == pytest.approx(1 / 3)  # still the groups' own signal


def test_a_step_of_one_reward_trains_nothing_even_with_a_batch_baseline() -> None:
    groups = [_group(1, [1.0, 1.0]), _group(2, [1.0, 1.0])]
    seqs, metrics = prepare_step(groups, TrainConfig(flat_groups="batch_baseline"), 1)
    assert seqs == [] and metrics["nothing_trainable"] == 1.0
    assert metrics["zero_variance_groups"] == 2 and metrics["flat_groups_trained"] == 0


def test_a_batch_baseline_without_scaling_only_centres() -> None:
    config = TrainConfig(flat_groups="batch_baseline", scale_rewards=False)
    advantages, _ = _advantages(config)
    assert advantages["g2t0"] == pytest.approx(1 / 3) and advantages["g1t1"] == 0.5


def test_a_batch_baseline_and_the_signal_share_scale_are_refused_together() -> None:
    with pytest.raises(ValueError, match="drop one"):
        TrainConfig(flat_groups="batch_baseline", signal_share_scale=True)


def test_a_positive_batch_baseline_trains_only_flat_groups_above_the_step_mean() -> None:
    advantages, metrics = _advantages(TrainConfig(flat_groups="batch_baseline_positive"))
    std = (5 / 36) ** 0.5
    assert advantages == pytest.approx(
        {"g1t0": -1.0, "g1t1": 1.0, "g2t0": (1 - 2 / 3) / std, "g2t1": (1 - 2 / 3) / std},
        abs=1e-4,
    )  # the flat group at 0.5, below the mean, is skipped as before
    assert metrics["flat_groups_trained"] == 1 and metrics["zero_variance_groups"] == 1


def test_rollouts_that_sampled_the_same_thing_are_trained_once_with_their_count() -> None:
    same = _group(1, [1.0, 1.0, 0.0])
    twin = same.trajectories[0].model_copy(deep=True, update={"id": "g1t1"})
    trajs = [same.trajectories[0], twin, same.trajectories[2]]
    seqs, metrics = prepare_step([TrajectoryGroup(trajs)], TrainConfig(), 1)
    assert metrics["duplicate_sequences"] == 1
    assert [(s.trajectory_id, s.copies) for s in seqs] == [("g1t0", 2), ("g1t2", 1)]
    assert seqs[0].advantage == pytest.approx(-seqs[1].advantage / 2, abs=1e-5)


def _agent_rollout(tag: str, reward: float, calls: list[tuple[str, str]]) -> Trajectory:
    """A rollout whose k-th call made the tool call calls[k] (name, JSON arguments), its
    prompt extending the last call's prompt and completion, as an agent's turns do."""
    made, prompt = [], [7]
    for k, (name, args) in enumerate(calls):
        completion = [100 + k, 200 + k]
        tool_call = {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": args}}  # fmt: skip
        made.append(
            LLMCall(
                id=f"{tag}{k}", node="agent", namespace=["agent"], prompt_token_ids=list(prompt),
                completion_token_ids=completion, logprobs=[-0.1, -0.1],
                response_message={"role": "assistant", "tool_calls": [tool_call]},
            )
        )  # fmt: skip
        prompt += [*completion, 50 + k]  # the tool's result
    return Trajectory(id=tag, reward=reward, calls=made)


def test_a_repeated_call_trains_at_most_zero_when_asked() -> None:
    from art_langgraph.training.prepare import repeated_call_ids

    # one solved rollout that looked up twice (arguments written in another key order),
    # one failed rollout that did too
    solved = [("lookup", '{"a": 1, "b": 2}'), ("lookup", '{"b":2,"a":1}'), ("done", '{"x": 3}')]
    failed = [("lookup", '{"a": 1, "b": 2}'), ("lookup", '{"a": 1, "b": 2}'), ("done", '{"x": 4}')]
    groups = [TrajectoryGroup([_agent_rollout("s", 1.0, solved), _agent_rollout("f", 0.0, failed)])]
    assert repeated_call_ids(groups[0].trajectories[0]) == ["s1"]
    assert repeated_call_ids(_agent_rollout("o", 0.0, [solved[0], ("lookup", '{"a": 2}')])) == []

    def token_advantages(config: TrainConfig) -> dict[str, list[float]]:
        seqs, metrics = prepare_step(groups, config, 1)
        got = {}
        for s in seqs:
            each = s.token_advantages or [s.advantage] * len(s.tokens)
            got[s.trajectory_id] = [a for a, t in zip(each, s.trainable, strict=True) if t]
        return got | {"zeroed": [metrics["repeated_calls_zeroed"]]}

    plain = token_advantages(TrainConfig())
    assert plain["s"] == pytest.approx([1.0] * 6, abs=1e-5)  # every call on the rollout's
    assert plain["zeroed"] == [0.0]
    capped = token_advantages(TrainConfig(repeated_calls="at_most_zero"))
    assert capped["s"] == pytest.approx([1.0, 1.0, 0.0, 0.0, 1.0, 1.0], abs=1e-5)
    assert capped["f"] == pytest.approx([-1.0] * 6, abs=1e-5)  # a failure's repeat: still down
    assert capped["zeroed"] == [1.0]
