"""Zero retokenization drift on the real 49k-vocabulary tokenizer (SmolLM2-135M-Instruct).

The form of test_drift.py, on the real preset, whose chat template ignores tools (so the
generic tool format is what renders them): 24 multi-turn rollouts with forced tool calls,
unicode, numbers and JSON in questions and tool results (the broken split below hit 75 of
200 later turns, so 24 runs would meet it many times over).
Every training sequence must equal the served prompt and completion ids token for token:
no drift reaches training.

Every later turn's prompt extends the previous prompt + completion token for token, so
the trainer merges each rollout into one sequence: the server renders earlier turns from
the ids it sampled (TrainableChatModel sends them back with the history). Before it did,
125 of 200 later turns over 100 runs extended; the rest broke on a non-canonical split
that constrained decoding allows (the sampled call closing with `}` `}` where the
tokenizer, re-encoding the rendered text, writes `}}`), and a new sequence started there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from langchain.agents import create_agent
from langchain_core.tools import tool

import art_langgraph as art
from art_langgraph.engine import TorchEngine
from art_langgraph.serving import ServerHandle
from art_langgraph.tracing.chat_model import build_chat_model
from art_mcp.agent import force_tool_calls
from tests.langgraph.test_drift import check_no_drift

pytestmark = pytest.mark.slow
RUNS = 24


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return json.dumps({"sum": a + b, "note": "añadido ✓"}, ensure_ascii=False)


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 21.5 °C, «sunny», wind 3 m/s"


async def test_real_tokenizer_runs_have_zero_drift(
    smol_server: tuple[TorchEngine, ServerHandle],
) -> None:
    llm = build_chat_model(
        name="smol",
        step=None,
        base_url=smol_server[1].base_url,
        api_key="unused",
        max_tokens=40,
        temperature=0.8,
    )
    agent = create_agent(
        llm,
        tools=[add, weather],
        middleware=[force_tool_calls()],
    )
    questions = [
        f'What is {i} plus {i * 37 % 1000}? Reply in JSON like {{"n": {i}}}.'
        if i % 2
        else f"¿Qué tiempo hace en São Paulo ({i})? «rápido» 🌧"
        for i in range(RUNS)
    ]

    async def run(q: str) -> art.Trajectory:
        with art.capture() as traj, contextlib.suppress(Exception):
            await agent.ainvoke({"messages": [("user", q)]}, {"recursion_limit": 6})
        return traj

    trajs = await asyncio.gather(*(run(q) for q in questions))
    multi_turn, merged, calls_total = check_no_drift(trajs)
    later_turns = calls_total - len(trajs)
    # A first reply cut at max_tokens holds no complete call, so its run ends there (the
    # sampled city string can run past 40 tokens: 1 of 80 runs in a probe). Every other run
    # must reach a second turn.
    trainable = [[c for c in t.calls if c.trainable] for t in trajs]
    cut = sum(len(calls) == 1 and calls[0].finish_reason == "length" for calls in trainable)
    assert cut <= RUNS // 4, f"{cut} of {RUNS} first replies were cut at max_tokens"
    assert multi_turn == RUNS - cut, f"only {multi_turn} of {RUNS - cut} uncut runs went on"
    assert merged == later_turns, f"only {merged} of {later_turns} later turns merged"
