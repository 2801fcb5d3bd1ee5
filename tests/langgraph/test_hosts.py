"""The three LangGraph hosts users have: create_agent, langgraph's prebuilt agent, a StateGraph with ToolNode.

The model is the tiny preset after a short SFT on tool-call demonstrations, so the
agents really call tools (and sometimes call them wrong, which is captured too).
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import art_langgraph as art
from art_langgraph.training import build_sequences
from tests.langgraph.tools import TOOLS

QUESTIONS = [f"What is {a} plus {b}?" for a, b in [(3, 4), (12, 30), (55, 1), (9, 9)]] + [
    f"How is the weather in {c}?" for c in ["Oslo", "Rome", "Paris", "Lima"]
]


def _prebuilt(llm: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # create_react_agent is deprecated in favour of create_agent
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(llm, TOOLS)


def _state_graph(llm: Any) -> Any:
    bound = llm.bind_tools(TOOLS)

    async def call_model(state: MessagesState) -> dict:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(TOOLS, handle_tool_errors=True))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    graph.add_edge("tools", "model")
    return graph.compile()


HOSTS: dict[str, Callable[[Any], Any]] = {
    "create_agent": lambda llm: create_agent(llm, tools=TOOLS),
    "prebuilt": _prebuilt,
    "state_graph": _state_graph,
}


async def _run(agent: Any, question: str) -> art.Trajectory:
    # a run that loops past the recursion limit is recorded, not fatal
    with art.capture(metadata={"question": question}) as traj, contextlib.suppress(Exception):
        await agent.ainvoke({"messages": [("user", question)]}, {"recursion_limit": 8})
    return traj


@pytest.mark.parametrize("host", sorted(HOSTS))
async def test_host_runs_are_captured_token_exactly(
    host: str, tool_model: art.TrainableModel
) -> None:
    agent = HOSTS[host](tool_model.chat_model(max_tokens=48, temperature=0))
    trajs = await asyncio.gather(*(_run(agent, q) for q in QUESTIONS))
    good, step = 0, await tool_model.get_step()
    for traj in trajs:
        assert traj.calls and all(c.trainable and c.completion_token_ids for c in traj.calls)
        assert all(c.model == f"{tool_model.name}@{step}" for c in traj.calls)
        assert traj.messages and traj.messages[0] == {
            "role": "user",
            "content": traj.metadata["question"],
        }
        for ev in traj.tool_events:
            assert ev.tool_call_id in {
                tc["id"] for c in traj.calls for tc in c.response_message.get("tool_calls") or []
            }
            if ev.error is None:
                want = (
                    ev.args["a"] + ev.args["b"]
                    if ev.name == "add"
                    else f"18 C and sunny in {ev.args['city']}"
                )  # type: ignore[index]
                assert str(ev.result) == str(want)
                good += 1
        seqs, _ = build_sequences(traj, 1.0, max_seq_length=4096)
        assert sum(s.num_trainable for s in seqs) == sum(
            len(c.completion_token_ids or []) for c in traj.calls
        )
    assert good >= 3, f"only {good} successful tool calls in {len(trajs)} runs"


async def test_the_compiled_graph_serves_the_next_step_after_train(
    fresh_model: art.TrainableModel,
) -> None:
    agent = create_agent(fresh_model.chat_model(max_tokens=8), tools=TOOLS)
    trajs = await asyncio.gather(*(_run(agent, q) for q in QUESTIONS))
    assert {c.model for t in trajs for c in t.calls} == {f"{fresh_model.name}@0"}
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)
    result = await fresh_model.train(
        [art.TrajectoryGroup(trajs[:4]), art.TrajectoryGroup(trajs[4:])]
    )
    assert result.step == 1
    after = await _run(agent, "What is 1 plus 1?")  # the same compiled graph, no rebuild
    assert [c.model for c in after.calls] == [f"{fresh_model.name}@1"] * len(after.calls)
    pinned = create_agent(fresh_model.chat_model(step=0, max_tokens=8), tools=TOOLS)
    assert (await _run(pinned, "What is 1 plus 1?")).calls[0].model == f"{fresh_model.name}@0"


async def test_subgraph_calls_are_captured(tool_model: art.TrainableModel) -> None:
    inner = create_agent(tool_model.chat_model(max_tokens=48, temperature=0), tools=TOOLS)
    outer = StateGraph(MessagesState)
    outer.add_node("agent", inner)
    outer.add_edge(START, "agent")
    outer.add_edge("agent", END)
    app = outer.compile()
    traj = await _run(app, "How is the weather in Oslo?")
    assert traj.calls and traj.calls[0].trainable
    assert traj.messages[-1]["role"] in ("assistant", "tool")
