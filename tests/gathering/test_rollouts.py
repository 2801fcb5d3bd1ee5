"""`art.rollouts`: a group of fresh runs of one graph on one input, captured and scored.

A real `create_agent` graph and a real compiled StateGraph on the tiny random model with a
few completion tokens; the group trains a real step.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph

import art_langgraph as art
from art_langgraph.errors import UsageError
from art_langgraph.training.config import TrainConfig


def one_step_graph(llm: Any, running: list[int], peak: list[int]) -> Any:
    """START -> answer -> END; `answer` raises when the run's `configurable.fail` is set and
    counts how many runs are inside it at once."""

    async def answer(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        if config["configurable"].get("fail"):
            raise RuntimeError("this run refuses")
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            reply = await llm.ainvoke(state["messages"])
            await asyncio.sleep(0.01)  # the next run would start here if allowed to
        finally:
            running[0] -= 1
        return {"messages": [reply]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile()


async def test_a_group_of_agent_runs_is_scored_and_trains(
    fresh_model: art.TrainableModel,
) -> None:
    agent = create_agent(fresh_model.chat_model(max_tokens=6, temperature=1.0), tools=[])

    async def reward(traj: art.Trajectory, output: dict[str, Any]) -> float:
        assert output["messages"][-1].type == "ai"  # what the graph returned
        return float(traj.metadata["run"])  # distinct, so the group carries signal

    group = await art.rollouts(
        agent, {"messages": "Say hello."}, 4, reward=reward, metadata={"task": "hello"}
    )
    assert [t.metadata["run"] for t in group] == [0, 1, 2, 3]
    assert [t.reward for t in group] == [0.0, 1.0, 2.0, 3.0]
    assert all(len(t.calls) == 1 and t.calls[0].trainable for t in group)
    assert group.metadata == {"task": "hello"} and not group.exceptions
    await fresh_model.train([group], config=TrainConfig(learning_rate=1e-3))
    assert await fresh_model.get_step() == 1


async def test_failed_runs_and_rewards_become_exceptions(
    fresh_model: art.TrainableModel,
) -> None:
    running, peak = [0], [0]
    graph = one_step_graph(fresh_model.chat_model(max_tokens=4), running, peak)

    def poison(i: int, cfg: RunnableConfig) -> RunnableConfig:
        cfg["configurable"]["fail"] = i == 1
        return cfg

    def reward(traj: art.Trajectory, output: Any) -> float:
        if traj.metadata["run"] == 2:
            raise ValueError("no score for run 2")
        return 1.0

    group = await art.rollouts(graph, {"messages": "Hi."}, 4, reward=reward, configure=poison)
    assert [t.metadata["run"] for t in group] == [0, 3]
    messages = sorted(e.message for e in group.exceptions)
    assert len(messages) == 2 and "no score for run 2" in messages[0]
    assert "this run refuses" in messages[1]


async def test_max_concurrency_bounds_the_runs_at_once(
    fresh_model: art.TrainableModel,
) -> None:
    running, peak = [0], [0]
    graph = one_step_graph(fresh_model.chat_model(max_tokens=4), running, peak)
    group = await art.rollouts(graph, {"messages": "Hi."}, 3, max_concurrency=1)
    assert len(group) == 3 and peak[0] == 1 and all(t.reward == 0 for t in group)
    peak[0] = 0
    await art.rollouts(graph, {"messages": "Hi."}, 3)
    assert peak[0] == 3  # unbounded: all three inside the node at once


async def test_what_cannot_be_a_group_is_refused() -> None:
    with pytest.raises(UsageError, match="ainvoke"):
        await art.rollouts(object(), {}, 2)
    with pytest.raises(UsageError, match="n >= 1"):
        await art.rollouts(_Echo(), {}, 0)
    with pytest.raises(UsageError, match="max_concurrency"):
        await art.rollouts(_Echo(), {}, 2, max_concurrency=0)


class _Echo:
    async def ainvoke(self, input: Any, config: Any = None) -> Any:
        return input


def two_call_graph(llm: Any) -> Any:
    """START -> answer, which asks the model twice (the second time with its first reply)."""

    async def answer(state: MessagesState) -> dict[str, Any]:
        first = await llm.ainvoke(state["messages"])
        second = await llm.ainvoke([*state["messages"], first, ("user", "Again.")])
        return {"messages": [first, second]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    return graph.compile()


async def test_a_seeded_group_draws_again_what_it_drew(fresh_model: art.TrainableModel) -> None:
    """Each request of a seeded group carries a seed of its own (its run's, then its turn's),
    recorded on the call; the same seed sends the same seeds and samples the same tokens
    (one run at a time, so no batch of other shapes rounds the logits differently); a
    request's own `seed` wins."""
    graph = two_call_graph(fresh_model.chat_model(max_tokens=8, temperature=1.0))

    async def group(seed: int) -> list[list[Any]]:
        runs = await art.rollouts(graph, {"messages": "Hi."}, 3, seed=seed, max_concurrency=1)
        return [[(c.sampling["seed"], c.completion_token_ids) for c in t.calls] for t in runs]

    first, again, other = await group(11), await group(11), await group(12)
    seeds = [s for run in first for s, _ in run]
    assert len(seeds) == 6 and len(set(seeds)) == 6  # every run and turn draws its own
    assert again == first
    assert not {s for run in other for s, _ in run} & set(seeds)
    own = two_call_graph(fresh_model.chat_model(max_tokens=8, temperature=1.0, seed=7))
    kept = await art.rollouts(own, {"messages": "Hi."}, 2, seed=11)
    assert {c.sampling["seed"] for t in kept for c in t.calls} == {7}
    unseeded = await art.rollouts(graph, {"messages": "Hi."}, 2)
    assert all(c.sampling.get("seed") is None for t in unseeded for c in t.calls)
    with art.capture(seed=5) as outer:  # a block inside a seeded one goes on with its seeds
        with art.capture() as inner:
            await graph.ainvoke({"messages": "Hi."})
        await graph.ainvoke({"messages": "Hi."})
    got = [c.sampling["seed"] for c in [*inner.calls, *outer.calls]]
    assert got == [art.derive_seed(5, k) for k in range(4)]
