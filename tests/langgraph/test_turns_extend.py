"""A rollout's turns extend token for token: each call's prompt is the previous call's
prompt + the completion ids the engine sampled + the new turns' ids.

The tiny preset is random, so what it samples is rarely the tokenizer's own split of
the text (`}` `}` where encoding writes `}}`): re-rendering its replies from text would
break the prefix at almost every turn. `TrainableChatModel` sends each reply's sampled
ids back with the history and the server renders that turn from them; the trainer then
merges every call of a rollout into one sequence (`prefix_breaks` 0).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage

import art_langgraph as art
from art_langgraph.training import build_sequences
from art_mcp.agent import force_tool_calls
from tests.langgraph.tools import TOOLS


def first_break(trajs: list[art.Trajectory], tokenizer: Any = None) -> str | None:
    """Where the first later call's prompt does not start with the previous call's prompt +
    completion (with the decoded text around it), or None when every call extends."""
    for t in trajs:
        calls = [c for c in t.calls if c.trainable]
        for k in range(1, len(calls)):
            prev = [
                *(calls[k - 1].prompt_token_ids or []),
                *(calls[k - 1].completion_token_ids or []),
            ]
            cur = list(calls[k].prompt_token_ids or [])
            if cur[: len(prev)] == prev:
                continue
            at = next(
                (j for j, (a, b) in enumerate(zip(prev, cur, strict=False)) if a != b), len(cur)
            )
            where = f"trajectory {t.id}, call {k}: first difference at token {at}"
            if tokenizer is not None:
                where += f": {tokenizer.decode(prev[at - 8 : at + 8])!r} vs {tokenizer.decode(cur[at - 8 : at + 8])!r}"
            return where
    return None


def assert_turns_extend(trajs: list[art.Trajectory], tokenizer: Any = None) -> int:
    """Every later call extends the previous one and the trainer merges each rollout into
    one sequence; returns the number of later calls checked."""
    assert (problem := first_break(trajs, tokenizer)) is None, problem
    later = 0
    for t in trajs:
        calls = [c for c in t.calls if c.trainable]
        _, stats = build_sequences(t, 1.0, max_seq_length=10**6)
        assert stats.prefix_breaks == 0 and stats.merged_calls == len(calls) - 1
        later += len(calls) - 1
    return later


@pytest.mark.slow
@pytest.mark.parametrize("streaming", [False, True])
async def test_an_agents_forced_tool_turns_extend_token_for_token(
    fresh_model: art.TrainableModel, lg_backend: art.LocalBackend, streaming: bool
) -> None:
    agent: Any = create_agent(
        fresh_model.chat_model(max_tokens=60, temperature=1.0, streaming=streaming),
        tools=TOOLS,
        middleware=[force_tool_calls()],
    )
    # A random model's call may run past max_tokens (the run ends there); about half the
    # runs go on to the recursion limit (4 calls). Sampling is unseeded, so rollouts go on
    # until six later calls have been checked (every rollout must extend, whatever it did).
    trajs: list[art.Trajectory] = []
    later = 0
    for i in range(40):
        with art.capture() as traj, contextlib.suppress(Exception):  # out of turns
            await agent.ainvoke(
                {"messages": [("user", f"What is {i} plus {3 * i}?")]}, {"recursion_limit": 7}
            )
        trajs.append(traj)
        later = assert_turns_extend(trajs, lg_backend.engine.tokenizer)
        if later >= 6:
            break
    assert later >= 6, f"{len(trajs)} rollouts made only {later} later calls"


async def test_free_text_turns_extend_and_an_edited_reply_is_rendered_as_edited(
    fresh_model: art.TrainableModel, lg_backend: art.LocalBackend
) -> None:
    llm = fresh_model.chat_model(max_tokens=24, temperature=1.0)
    tok = lg_backend.engine.tokenizer
    history: list[Any] = []
    with art.capture() as traj:
        for turn in range(4):
            history.append(HumanMessage(f"turn {turn}: say more"))
            reply = await llm.ainvoke(history)
            assert isinstance(reply, AIMessage)
            history.append(reply)
    # Random text: re-encoding it differs from the sampled split in some turn.
    sampled = [c.completion_token_ids or [] for c in traj.calls]
    assert any(
        tok.encode(tok.decode(ids, skip_special_tokens=True), add_special_tokens=False)
        != [t for t in ids if t not in tok.all_special_ids]
        for ids in sampled
    )
    assert assert_turns_extend([traj], tok) == 3

    # A reply edited in the graph keeps its metadata; the server renders the edit.
    edited = history[-1].model_copy(update={"content": "an edited reply"})
    with art.capture() as after:
        await llm.ainvoke([*history[:-1], edited, HumanMessage("and now?")])
    prompt = tok.decode(after.calls[0].prompt_token_ids)
    assert "an edited reply" in prompt
