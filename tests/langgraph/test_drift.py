"""Zero retokenization drift over 200 generated multi-turn, tool-using agent runs.

For every captured trajectory, the training sequences equal, token for token, the
prompt and completion ids the engine served, and the trainable mask covers exactly
the sampled tokens: each sequence is checked against an expectation built from the raw
served ids, independently of the tensorizer's own merge logic.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from langchain.agents import create_agent

import art_langgraph as art
from art_langgraph.training import build_sequences
from tests.langgraph.tools import TOOLS

pytestmark = pytest.mark.slow


def _expected(calls: list[art.LLMCall]) -> list[tuple[list[int], list[bool]]]:
    """Sequences as the served ids dictate: a call extends the previous one iff its prompt starts with it."""
    out: list[tuple[list[int], list[bool]]] = []
    for c in calls:
        prompt, completion = list(c.prompt_token_ids or []), list(c.completion_token_ids or [])
        if out and prompt[: len(out[-1][0])] == out[-1][0]:
            tokens, mask = out[-1]
            mask = mask + [False] * (len(prompt) - len(tokens)) + [True] * len(completion)
            out[-1] = (prompt + completion, mask)
        else:
            out.append((prompt + completion, [False] * len(prompt) + [True] * len(completion)))
    return out


def check_no_drift(trajs: list[art.Trajectory]) -> tuple[int, int, int]:
    """Assert every trajectory trains on exactly its served ids; returns (runs with more than
    one call, calls merged into the previous sequence, calls in all)."""
    multi_turn = merged = calls_total = 0
    for traj in trajs:
        calls = [c for c in traj.calls if c.trainable]
        assert calls
        seqs, stats = build_sequences(traj, 0.5, max_seq_length=10**6)
        want = _expected(calls)
        assert [s.tokens for s in seqs] == [w[0] for w in want]
        assert [s.trainable for s in seqs] == [w[1] for w in want]
        for s in seqs:  # sampler logprobs sit exactly on the trainable tokens
            assert all(
                (lp == lp) == m for lp, m in zip(s.sampler_logprobs, s.trainable, strict=True)
            )
        multi_turn += len(calls) > 1
        merged += stats.merged_calls
        calls_total += len(calls)
    return multi_turn, merged, calls_total


async def test_200_runs_have_zero_drift(tool_model: art.TrainableModel) -> None:
    agent = create_agent(tool_model.chat_model(max_tokens=48, temperature=0.3), tools=TOOLS)
    questions = [
        f"What is {i} plus {i * 3 % 97}?" if i % 2 else f"How is the weather in city {i}?"
        for i in range(200)
    ]

    # All 200 at once, as a user would: this once hung the suite (a garbage-collected HTTP
    # client unregistered live sockets from the event loop; see chat_model.py).
    async def run(q: str) -> art.Trajectory:
        with art.capture() as traj, contextlib.suppress(Exception):
            await agent.ainvoke({"messages": [("user", q)]}, {"recursion_limit": 8})
        return traj

    trajs = await asyncio.gather(*(run(q) for q in questions))
    multi_turn, merged, _ = check_no_drift(trajs)
    assert multi_turn >= 40, f"only {multi_turn} of 200 runs had more than one turn"
    assert merged >= 20, f"only {merged} calls merged into the previous sequence"
