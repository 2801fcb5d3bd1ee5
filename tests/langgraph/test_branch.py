"""`art.branch`: a group of continuations of one thread from one saved checkpoint.

A real compiled graph (three sequential chat-model steps) on a real AsyncSqliteSaver in a
temp file, and on InMemorySaver; the tiny random model with 8 completion tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

import art_langgraph as art
from art_langgraph.errors import UsageError
from art_langgraph.gathering.branch import branch
from art_langgraph.training.config import TrainConfig
from art_langgraph.training.prepare import prepare_step
from art_langgraph.training.tensorize import micro_batches, prefix_units

PROMPT = "Write a long story about a lighthouse keeper and the sea, one sentence per turn."


def steps_graph(llm: Any, steps: int = 3, checkpointer: Any = None) -> Any:
    """step1 -> step2 -> ... -> end; each step appends the model's reply. Step k raises
    when the run's `configurable.fail_step` is k."""
    graph = StateGraph(MessagesState)

    def make(k: int) -> Any:
        async def node(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            if config["configurable"].get("fail_step") == k:
                raise RuntimeError(f"step{k} refuses to continue")
            return {"messages": [await llm.ainvoke(state["messages"])]}

        return node

    for k in range(1, steps + 1):
        graph.add_node(f"step{k}", make(k))
        graph.add_edge(START if k == 1 else f"step{k - 1}", f"step{k}")
    graph.add_edge(f"step{steps}", END)
    return graph.compile(checkpointer=checkpointer)


async def run_once(app: Any, thread: str) -> art.Trajectory:
    with art.capture() as traj:
        await app.ainvoke({"messages": [("user", PROMPT)]}, {"configurable": {"thread_id": thread}})
    assert len(traj.calls) == 3 and traj.exception is None
    return traj


async def test_branches_share_history_and_train_it_once(
    fresh_model: art.TrainableModel, tmp_path: Path
) -> None:
    llm = fresh_model.chat_model(max_tokens=8, temperature=1.0)
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "ckpt.sqlite")) as saver:
        app = steps_graph(llm, checkpointer=saver)
        original = await run_once(app, "t1")
        # The checkpoint step 2 started from: user turn + step 1's reply.
        second = original.calls[1]
        assert second.node == "step2" and second.thread_id == "t1" and second.checkpoint_id
        cfg = {"configurable": {"thread_id": "t1", "checkpoint_id": second.checkpoint_id}}
        n = 4
        group = await branch(app, cfg, n, metadata={"task": "lighthouse"})

    assert group.metadata == {
        "task": "lighthouse",
        "thread_id": "t1",
        "checkpoint_id": second.checkpoint_id,
    }
    assert not group.exceptions and len(group) == n
    assert [t.metadata["branch"] for t in group] == list(range(n))
    for traj in group:
        # Each branch runs steps 2 and 3 only; its first prompt is the history, token for token.
        assert [c.node for c in traj.calls] == ["step2", "step3"]
        assert traj.calls[0].prompt_token_ids == second.prompt_token_ids
        assert traj.calls[0].checkpoint_id != second.checkpoint_id  # a fork of its own
        assert traj.messages[:2] == original.messages[:2]
        assert len(traj.messages) == 4
    # ... and that history is the saved run's own tokens: step 1's prompt and sampled reply.
    first = original.calls[0]
    head = (first.prompt_token_ids or []) + (first.completion_token_ids or [])
    assert (second.prompt_token_ids or [])[: len(head)] == head
    # Sampling differs between branches.
    assert len({tuple(t.calls[0].completion_token_ids or []) for t in group}) > 1

    # The trainer computes the shared history once: one prefix tree of the n sequences.
    for i, traj in enumerate(group):
        traj.reward = float(i)
    config = TrainConfig()
    seqs, metrics = prepare_step([group], config, 1)
    assert len(seqs) == n and metrics["tensorize/prefix_breaks"] == 0
    history = len(second.prompt_token_ids or [])
    assert all(s.tokens[:history] == second.prompt_token_ids for s in seqs)
    units = prefix_units(seqs, config.micro_batch_tokens)
    assert len(units) == 1 and sorted(units[0].members) == list(range(n))
    # Shared parts stop one token short of each head: history - 1 tokens saved per extra branch.
    assert units[0].saved >= (n - 1) * (history - 1)
    (mb,) = micro_batches(
        seqs,
        row_length=config.max_seq_length,
        micro_batch_tokens=config.micro_batch_tokens,
        pack=True,
        share_prefixes=True,
    )
    total = sum(len(s) for s in seqs)
    assert mb.real_tokens == total - units[0].saved
    assert mb.real_tokens < total - (n - 1) * (history - 1) + 1
    # The shared history sits in the row once (seq id -2), not n times.
    shared = int((mb.seq_ids == -2).sum())
    assert history - 1 <= shared < 2 * history
    row = mb.input_ids[0][mb.seq_ids[0] == -2].tolist()
    assert row[: history - 1] == (second.prompt_token_ids or [])[: history - 1]


async def test_branch_from_latest_checkpoint_in_memory(fresh_model: art.TrainableModel) -> None:
    """No checkpoint id: the thread's latest, pinned once; new input on top of its state."""
    llm = fresh_model.chat_model(max_tokens=8, temperature=1.0)
    app = steps_graph(llm, checkpointer=InMemorySaver())
    await run_once(app, "t2")
    head = await app.aget_state({"configurable": {"thread_id": "t2"}})
    group = await branch(
        app,
        {"configurable": {"thread_id": "t2"}},
        3,
        input={"messages": [("user", "Go on.")]},
        reward=lambda traj, out: float(len(out["messages"])),
        max_concurrency=2,
    )
    assert group.metadata["checkpoint_id"] == head.config["configurable"]["checkpoint_id"]
    assert len(group) == 3 and not group.exceptions
    for traj in group:
        # The user turn and the 3 steps of the first run, "Go on.", then 3 new steps.
        assert traj.reward == 8.0 and len(traj.calls) == 3
        assert traj.messages[4] == {"role": "user", "content": "Go on."}


@pytest.mark.parametrize("max_concurrency", [None, 1])
async def test_branch_resumes_an_interrupt(
    fresh_model: art.TrainableModel, max_concurrency: int | None
) -> None:
    """Concurrent, and one at a time (each later branch finds the thread moved past the
    checkpoint, which LangGraph then replays): every branch resumes the same interrupt."""
    llm = fresh_model.chat_model(max_tokens=8, temperature=1.0)
    graph = StateGraph(MessagesState)

    async def ask(state: MessagesState) -> dict[str, Any]:
        answer = interrupt("Which topic?")
        return {"messages": [("user", f"Topic: {answer}")]}

    async def write(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph.add_node("ask", ask)
    graph.add_node("write", write)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "write")
    graph.add_edge("write", END)
    app = graph.compile(checkpointer=InMemorySaver())
    cfg: RunnableConfig = {"configurable": {"thread_id": "t3"}}
    await app.ainvoke({"messages": [("user", PROMPT)]}, cfg)  # type: ignore[call-overload]
    assert (await app.aget_state(cfg)).next == ("ask",)
    group = await branch(
        app, cfg, 4, input=Command(resume="the sea"), max_concurrency=max_concurrency
    )
    assert len(group) == 4 and not group.exceptions
    for traj in group:
        assert [c.node for c in traj.calls] == ["write"]
        assert traj.messages[1] == {"role": "user", "content": "Topic: the sea"}
        assert len(traj.messages) == 3
    prompts = {tuple(t.calls[0].prompt_token_ids or []) for t in group}
    assert len(prompts) == 1
    assert len({tuple(t.calls[0].completion_token_ids or []) for t in group}) > 1


async def test_missing_checkpoint_and_no_checkpointer(fresh_model: art.TrainableModel) -> None:
    llm = fresh_model.chat_model(max_tokens=8)
    app = steps_graph(llm, checkpointer=InMemorySaver())
    await run_once(app, "t4")
    history = [
        s.config["configurable"]["checkpoint_id"]
        async for s in app.aget_state_history({"configurable": {"thread_id": "t4"}})
    ]
    bad = {"configurable": {"thread_id": "t4", "checkpoint_id": "1f0-no-such-checkpoint"}}
    with pytest.raises(UsageError) as err:
        await branch(app, bad, 2)
    msg = str(err.value)
    assert "'t4'" in msg and "1f0-no-such-checkpoint" in msg and history[0] in msg
    with pytest.raises(UsageError, match=r"'empty'.*no checkpoints at all"):
        await branch(app, {"configurable": {"thread_id": "empty"}}, 2)
    with pytest.raises(UsageError, match="thread_id"):
        await branch(app, {"configurable": {}}, 2)
    with pytest.raises(UsageError, match="without a checkpointer"):
        await branch(steps_graph(llm), {"configurable": {"thread_id": "t4"}}, 2)
    with pytest.raises(UsageError, match="keep the thread"):
        await branch(
            app,
            {"configurable": {"thread_id": "t4"}},
            2,
            configure=lambda i, c: {"configurable": {"thread_id": f"other{i}"}},
        )


async def test_one_branch_raising_and_training_the_group(
    fresh_model: art.TrainableModel, tmp_path: Path
) -> None:
    llm = fresh_model.chat_model(max_tokens=8, temperature=1.0)
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "ckpt.sqlite")) as saver:
        app = steps_graph(llm, checkpointer=saver)
        original = await run_once(app, "t5")
        cfg = {
            "configurable": {"thread_id": "t5", "checkpoint_id": original.calls[1].checkpoint_id}
        }

        def poison(i: int, c: Any) -> Any:
            if i == 1:
                c["configurable"]["fail_step"] = 3
            return c

        group = await branch(
            app, cfg, 4, configure=poison, reward=lambda t, out: float(t.metadata["branch"])
        )
    assert len(group) == 3 and len(group.exceptions) == 1
    assert [t.metadata["branch"] for t in group] == [0, 2, 3]
    assert "step3 refuses to continue" in group.exceptions[0].message
    result = await fresh_model.train([group], config=TrainConfig(learning_rate=1e-3))
    assert await fresh_model.get_step() == 1
    assert result is not None
