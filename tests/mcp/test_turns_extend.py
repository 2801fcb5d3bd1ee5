"""The harness's rollouts extend token for token, on the tiny and on the real preset.

The workload of `art-mcp train` (and `scripts/demo.sh --real`): the bundled MCP server
(in-process here), the harness's system prompt, its `complete_task` tool and forced tool
calls. On the real preset (SmolLM2-135M-Instruct, whose template ignores tools, so the
generic format renders them) the constrained decoder often samples a split of the call
that the tokenizer would not write (`E` `gypt` for `Egypt`, `ad` `d` for `add`); before
the server rendered earlier turns from their sampled ids, 3 of 18 later calls broke the
prefix in a probe over these scenarios. Now every call's prompt starts with the previous
prompt + completion, and the trainer merges each rollout into one sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain.agents import create_agent

import art_langgraph as art
from art_langgraph.engine import TorchEngine
from art_langgraph.serving import ServerHandle
from art_langgraph.tracing.chat_model import build_chat_model
from art_mcp import MCPToolset
from art_mcp.agent import SYSTEM, complete_task_tool, force_tool_calls
from art_mcp.scenarios import Scenario, load_scenarios
from examples.mcp_server.server import server as mcp_server
from tests.langgraph.test_turns_extend import assert_turns_extend

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def toolset() -> AsyncIterator[MCPToolset]:
    async with MCPToolset(mcp_server) as ts:
        yield ts


def _scenarios(n: int) -> list[Scenario]:
    return load_scenarios("examples/mcp_server/scenarios.jsonl")[:n]


async def _rollouts(
    llm: Any, toolset: MCPToolset, scenarios: list[Scenario], group: int
) -> list[art.Trajectory]:
    """The harness's rollout: its agent over the server's tools, 3 turns at most."""
    agent: Any = create_agent(
        llm,
        tools=[*toolset.langchain_tools(), complete_task_tool()],
        system_prompt=SYSTEM,
        middleware=[force_tool_calls()],
    )

    async def rollout(s: Scenario) -> art.Trajectory:
        with art.capture() as traj:
            try:
                await agent.ainvoke({"messages": [("user", s.task)]}, {"recursion_limit": 7})
            except Exception as exc:  # out of turns
                traj.log(f"rollout stopped: {exc!r}")
        return traj

    return list(await asyncio.gather(*(rollout(s) for s in scenarios for _ in range(group))))


async def test_the_harness_rollouts_extend_on_the_tiny_preset(
    fresh_model: art.TrainableModel, lg_backend: art.LocalBackend, toolset: MCPToolset
) -> None:
    llm = fresh_model.chat_model(max_tokens=96, temperature=0.8)
    trajs = await _rollouts(llm, toolset, _scenarios(4), 2)
    assert assert_turns_extend(trajs, lg_backend.engine.tokenizer) >= 4


async def test_the_harness_rollouts_extend_on_the_real_preset(
    smol_server: tuple[TorchEngine, ServerHandle], toolset: MCPToolset
) -> None:
    engine, handle = smol_server
    llm = build_chat_model(
        name="smol",
        step=None,
        base_url=handle.base_url,
        api_key="unused",
        max_tokens=96,
        temperature=0.8,
    )
    trajs = await _rollouts(llm, toolset, _scenarios(2), 2)
    assert assert_turns_extend(trajs, engine.tokenizer) >= 4


@pytest.mark.parametrize("rule", ["answer", "switch"])
async def test_after_a_repeated_call_the_next_turn_answers_or_moves_on(
    rule: str, fresh_model: art.TrainableModel, lg_backend: art.LocalBackend, toolset: MCPToolset
) -> None:
    """`after_repeat`: the turn after one whose calls all repeat earlier calls (name and
    arguments) may only call complete_task ("answer"), or any tool but the repeated ones
    ("switch": an `allowed_tools` choice, every tool still in the prompt, and no call of a
    repeated one); every other turn may call any tool. Greedy on the tiny preset, which
    repeats its lookups."""
    agent: Any = create_agent(
        fresh_model.chat_model(max_tokens=48, temperature=0),
        tools=[*toolset.langchain_tools(), complete_task_tool()],
        system_prompt=SYSTEM,
        middleware=[force_tool_calls(None, after_repeat=rule)],
    )
    every = {t.name for t in toolset.langchain_tools()} | {"complete_task"}
    forced = 0
    for s in _scenarios(6):
        with art.capture() as traj, contextlib.suppress(Exception):  # out of graph steps
            await agent.ainvoke({"messages": [("user", s.task)]}, {"recursion_limit": 13})
        seen: set[str] = set()
        repeated: set[str] = set()  # the tools of the turn before, when it only repeated
        for call in traj.calls:
            offered = {t["function"]["name"] for t in call.tools or []}
            choice = call.tool_choice
            named = (
                isinstance(choice, dict)
                and choice.get("function", {}).get("name") == "complete_task"
            )
            if rule == "answer":
                assert named == bool(repeated), (call.tool_choice, repeated)
            else:  # every tool still in the prompt; the grammar allows the others
                assert offered == every, offered
                allowed = (
                    {t["function"]["name"] for t in choice["allowed_tools"]["tools"]}
                    if isinstance(choice, dict)
                    else every
                )
                assert choice == "required" if not repeated else allowed == every - repeated
            forced += bool(repeated)
            made = [
                (c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in call.response_message.get("tool_calls") or []
            ]
            assert not {m[0] for m in made} & (repeated if rule == "switch" else set()), made
            keys = [json.dumps(m, sort_keys=True) for m in made]
            repeated = {m[0] for m in made} if made and all(k in seen for k in keys) else set()
            seen.update(keys)
    assert forced >= 1  # the rule was exercised
