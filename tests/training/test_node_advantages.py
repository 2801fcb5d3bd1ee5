"""Per-node rewards: advantages computed per node within a group, checked against values
worked out by hand, down to the per-token advantages of a packed micro-batch."""

from __future__ import annotations

import math

import pytest

from art_langgraph.errors import NonFiniteRewardError
from art_langgraph.training.config import TrainConfig
from art_langgraph.training.prepare import node_advantages, prepare_step, rewarded_node
from art_langgraph.training.tensorize import micro_batches
from art_langgraph.trajectories.trajectory import (
    TRAIN_NODES_KEY,
    LLMCall,
    Trajectory,
    TrajectoryGroup,
)

# Hand-computed: rewards r, mean m, population std s, advantage (r - m) / s.
# router [1, 0, 0.5]: m 0.5, s sqrt(1/6) -> [+1.2247, -1.2247, 0]
ROUTER = [math.sqrt(6) / 2, -math.sqrt(6) / 2, 0.0]
# agent, only the trajectories that ran it [0.2, 0.8]: m 0.5, s 0.3 -> [-1, +1]
AGENT = [-1.0, 1.0]
# summariser, named nowhere: the trajectory rewards [0, 1, 1]: m 2/3, s sqrt(2)/3
SUMMARY = [-math.sqrt(2), math.sqrt(2) / 2, math.sqrt(2) / 2]


def _call(node: str, prompt: list[int], completion: list[int], **kw: object) -> LLMCall:
    return LLMCall(
        node=node,
        namespace=kw.pop("namespace", [node]),  # type: ignore[arg-type]
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        **kw,  # type: ignore[arg-type]
    )


def _group() -> TrajectoryGroup:
    def rollout(i: int, reward: float, node_rewards: dict[str, float], agent: bool) -> Trajectory:
        base = 100 * (i + 1)
        router = _call("router", [base, base + 1], [base + 2])
        calls = [router]
        if agent:  # its prompt extends the router's: one sequence, two advantages
            calls.append(
                _call(
                    "agent",
                    [base, base + 1, base + 2, base + 3],
                    [base + 4, base + 5],
                    namespace=["research", "agent"],
                )
            )
        calls.append(_call("summarise", [base + 50, base + 51], [base + 52, base + 53, base + 54]))
        return Trajectory(id=f"t{i}", reward=reward, node_rewards=node_rewards, calls=calls)

    return TrajectoryGroup(
        [
            rollout(0, 0.0, {"router": 1.0, "agent": 0.2}, True),
            rollout(1, 1.0, {"router": 0.0, "agent": 0.8}, True),
            rollout(2, 1.0, {"router": 0.5}, False),
        ]
    )


def test_node_advantages_match_the_hand_computed_ones() -> None:
    group = _group()
    per_call, signal = node_advantages(group.trajectories)
    assert signal
    for i, traj in enumerate(group.trajectories):
        router = traj.calls[0]
        assert per_call[router.id] == pytest.approx(ROUTER[i], abs=1e-5)
        if i < 2:
            assert per_call[traj.calls[1].id] == pytest.approx(AGENT[i], abs=1e-5)
        assert traj.calls[-1].id not in per_call  # the summariser trains on `reward`


def test_a_prepared_step_trains_each_token_on_its_nodes_advantage() -> None:
    group = _group()
    seqs, metrics = prepare_step([group], TrainConfig(), 1)
    assert metrics["node_advantage_calls"] == 5
    by_traj: dict[str, list[list[float]]] = {}
    for s in seqs:
        advs = s.token_advantages or [s.advantage] * len(s)
        by_traj.setdefault(s.trajectory_id, []).append(
            [a for a, t in zip(advs, s.trainable, strict=True) if t]
        )
    for i in range(3):
        routed, summary = by_traj[f"t{i}"]
        expected = [ROUTER[i]] + ([AGENT[i]] * 2 if i < 2 else [])
        assert routed == pytest.approx(expected, abs=1e-5)
        assert summary == pytest.approx([SUMMARY[i]] * 3, abs=1e-5)
    (mb,) = micro_batches(seqs, row_length=64, micro_batch_tokens=4096, pack=True)
    trained = mb.advantages[mb.target_mask].tolist()
    want = sorted(
        [ROUTER[0], *[AGENT[0]] * 2, ROUTER[1], *[AGENT[1]] * 2, ROUTER[2]]
        + [a for a in SUMMARY for _ in range(3)]
    )
    assert sorted(trained) == pytest.approx(want, abs=1e-5)


def test_without_node_rewards_every_call_trains_on_the_trajectory_advantage() -> None:
    group = _group()
    for t in group.trajectories:
        t.node_rewards = {}
    seqs, metrics = prepare_step([group], TrainConfig(), 1)
    assert metrics["node_advantage_calls"] == 0
    assert all(s.token_advantages is None for s in seqs)
    assert {s.trajectory_id: s.advantage for s in seqs} == pytest.approx(
        {f"t{i}": SUMMARY[i] for i in range(3)}, abs=1e-5
    )


def test_equal_rewards_but_a_node_that_differs_still_trains() -> None:
    group = _group()
    for t in group.trajectories:
        t.reward = 0.5
    seqs, metrics = prepare_step([group], TrainConfig(), 1)
    assert metrics["zero_variance_groups"] == 0 and seqs
    for t in group.trajectories:
        t.node_rewards = {}
    _, metrics = prepare_step([group], TrainConfig(), 1)
    assert metrics["zero_variance_groups"] == 1


def test_a_subgraph_node_reward_covers_the_calls_inside_it() -> None:
    agent = _call("agent", [1], [2], namespace=["research", "agent"])
    assert rewarded_node(agent, {"research"}) == "research"
    assert rewarded_node(agent, {"research", "agent"}) == "agent"  # the innermost wins
    assert rewarded_node(agent, {"router"}) is None


def test_a_non_finite_node_reward_is_refused() -> None:
    with pytest.raises(NonFiniteRewardError, match="node 'agent'"):
        Trajectory(node_rewards={"agent": math.nan})
    traj = Trajectory()
    with pytest.raises(NonFiniteRewardError):
        traj.node_rewards = {"router": math.inf}


def test_a_train_nodes_name_no_rollout_ran_warns_at_train_time() -> None:
    group = _group()
    for traj in group:  # as capture(train_nodes=["agent", "plannr"]) leaves them
        traj.metadata[TRAIN_NODES_KEY] = ["agent", "plannr"]
    with pytest.warns(UserWarning, match=r"\['plannr'\].*\['agent', 'research', 'router'"):
        _, metrics = prepare_step([group], TrainConfig(), 1)
    assert metrics["train_nodes_unmatched"] == 1.0


def test_names_that_matched_in_some_rollout_do_not_warn(recwarn: pytest.WarningsRecorder) -> None:
    group = _group()  # the third rollout never ran the agent: the step as a whole did
    for traj in group:
        traj.metadata[TRAIN_NODES_KEY] = ["agent", "research"]
    _, metrics = prepare_step([group], TrainConfig(), 1)
    assert metrics["train_nodes_unmatched"] == 0.0 and not recwarn.list


def test_a_run_still_waiting_at_an_interrupt_warns_and_is_counted() -> None:
    group = _group()
    list(group)[1].interrupted = True
    with pytest.warns(UserWarning, match=r"1 of this step's 3 trajectories still wait"):
        seqs, metrics = prepare_step([group], TrainConfig(), 1)
    assert metrics["interrupted_trajectories"] == 1.0 and seqs  # it trains as it stands
