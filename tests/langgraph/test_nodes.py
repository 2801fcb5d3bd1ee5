"""Train chosen nodes: a router, an agent with a ToolNode inside a subgraph, and a
summariser, all on one chat model; only the chosen nodes' tokens reach the prepared step."""

from __future__ import annotations

import pytest

import art_langgraph as art
from art_langgraph.training.prepare import prepare_step
from art_langgraph.trajectories.trajectory import LLMCall
from examples.langgraph_nodes.graph import build_graph
from examples.langgraph_nodes.graph import node_rewards as example_node_rewards

QUESTION = {"messages": [("user", "What is 2 plus 3?")]}


async def _rollouts(model: art.TrainableModel, n: int, **capture_kw: object) -> art.TrajectoryGroup:
    graph = build_graph(model.chat_model(max_tokens=32, temperature=1.0))
    trajs = []
    for i in range(n):
        with art.capture(**capture_kw) as traj:  # type: ignore[arg-type]
            await graph.ainvoke(QUESTION)
        # a call left out by train_nodes is recorded untrainable, without a warning
        assert not [line for line in traj.logs if "cannot train" in line]
        traj.reward = float(i)  # different rewards: the group trains
        trajs.append(traj)
    return art.TrajectoryGroup(trajs)


def _calls(group: art.TrajectoryGroup, node: str) -> list[LLMCall]:
    return [c for t in group for c in t.calls if c.node == node]


@pytest.mark.parametrize(
    "train_nodes",
    [["agent"], "research", lambda call: call.node == "agent"],
    ids=["list", "name", "predicate"],  # one id in every pytest-xdist worker
)
async def test_only_the_chosen_nodes_tokens_are_trained(
    fresh_model: art.TrainableModel, train_nodes: object
) -> None:
    group = await _rollouts(fresh_model, 2, train_nodes=train_nodes)
    for traj in group:
        assert [c.node for c in traj.calls] == ["router", "agent", "summarise"]
        router, agent, summary = traj.calls
        assert agent.namespace == ["research", "agent"] and router.namespace == ["router"]
        assert agent.trainable and agent.completion_token_ids
        for other in (router, summary):  # recorded in full, for review and judging
            assert not other.trainable and other.completion_token_ids
            assert other.metadata["art_excluded"] == "train_nodes"
    seqs, _ = prepare_step([group], art.TrainConfig(), 1)
    agent_tokens = sum(len(c.completion_token_ids or []) for c in _calls(group, "agent"))
    assert sum(s.num_trainable for s in seqs) == agent_tokens
    trained = {tok for s in seqs for tok, t in zip(s.tokens, s.trainable, strict=True) if t}
    assert trained <= {t for c in _calls(group, "agent") for t in c.completion_token_ids or []}


async def test_by_default_every_node_trains(fresh_model: art.TrainableModel) -> None:
    group = await _rollouts(fresh_model, 2)
    seqs, _ = prepare_step([group], art.TrainConfig(), 1)
    every = sum(len(c.completion_token_ids or []) for t in group for c in t.calls)
    assert all(c.trainable for t in group for c in t.calls)
    assert sum(s.num_trainable for s in seqs) == every


async def test_train_nodes_naming_no_node_that_ran_warns_with_the_nodes_that_did(
    fresh_model: art.TrainableModel,
) -> None:
    with pytest.warns(UserWarning, match=r"named no node.*\['agent', 'router', 'summarise'\]"):
        group = await _rollouts(fresh_model, 1, train_nodes=["planner"])
    (traj,) = group
    assert not any(c.trainable for c in traj.calls) and "named no node" in traj.logs[-1]


async def test_a_predicate_that_selects_no_call_warns_with_the_nodes_that_ran(
    fresh_model: art.TrainableModel,
) -> None:
    with pytest.warns(UserWarning, match=r"predicate selected no call.*\['agent', 'router'"):
        group = await _rollouts(fresh_model, 1, train_nodes=lambda call: call.node == "planner")
    (traj,) = group
    assert not any(c.trainable for c in traj.calls)


async def test_a_misspelt_name_beside_a_right_one_warns_at_train_time(
    fresh_model: art.TrainableModel,
) -> None:
    group = await _rollouts(fresh_model, 2, train_nodes=["agent", "plannr"])
    with pytest.warns(UserWarning, match=r"names \['plannr'\].*called it: \['agent'"):
        seqs, metrics = prepare_step([group], art.TrainConfig(), 1)
    assert metrics["train_nodes_unmatched"] == 1.0 and seqs  # the agent's calls still train


async def test_node_rewards_train_router_and_agent_in_one_step(
    fresh_model: art.TrainableModel,
) -> None:
    group = await _rollouts(fresh_model, 3, train_nodes=["router", "agent"])
    task = {"tool": "add", "args": {"a": 2, "b": 3}}
    for i, traj in enumerate(group):
        traj.node_rewards = example_node_rewards(traj, task) | {"router": float(i % 2)}
    seqs, metrics = prepare_step([group], art.TrainConfig(), 1)
    assert metrics["node_advantage_calls"] >= 3  # every router call has its own advantage
    result = await fresh_model.train([group])
    assert result.metrics["trajectories"] == 3 and seqs
    assert result.metrics["learning_rate"] == 5e-4  # none given: the base model's (tiny's)
