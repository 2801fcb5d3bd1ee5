"""Train across interrupts and processes: a run that stops at `interrupt()` for a human's
approval and is resumed later, in another process, through a real SQLite checkpointer,
is one trajectory; a resumed thread whose trajectory is missing is an error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command

import art_langgraph as art
from tests.langgraph.approval_graph import approval_graph

ROOT = Path(__file__).resolve().parents[2]
QUESTION = {"messages": [("user", "What is 2 plus 3?")]}


async def _start(model: art.TrainableModel, db: Path, store: Path, thread: str) -> art.Trajectory:
    config = {"configurable": {"thread_id": thread}}
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = approval_graph(model.chat_model(max_tokens=8), saver)
        with art.capture(thread=config, store=store) as traj:
            out = await graph.ainvoke(QUESTION, config)
    assert "__interrupt__" in out
    return traj


async def test_a_run_resumed_in_another_process_is_one_trajectory(
    fresh_model: art.TrainableModel, tmp_path: Path
) -> None:
    db, store = tmp_path / "threads.sqlite", tmp_path / "store"
    first = await _start(fresh_model, db, store, "t-1")
    assert first.interrupted and [c.node for c in first.calls] == ["agent"]
    assert [t.id for t in art.ThreadStore(store).waiting()] == [first.id]

    out = tmp_path / "resumed.json"
    args = [str(db), str(store), "t-1", str(fresh_model.inference_base_url), fresh_model.name]
    run = subprocess.run(
        [sys.executable, "-m", "tests.langgraph.approval_graph", *args, "approve", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    traj = art.Trajectory.model_validate_json(out.read_text())

    assert traj.id == first.id and not traj.interrupted
    assert [c.node for c in traj.calls] == ["agent", "answer"]  # before and after approval
    assert traj.calls[0].completion_token_ids == first.calls[0].completion_token_ids
    assert all(c.trainable and c.thread_id == "t-1" for c in traj.calls)
    assert traj.resume_values == ["approve"] and art.resume_reward(traj) == 1.0
    # approved: the ToolNode ran what the agent asked for (the random model's call may be cut)
    assert [e.tool_call_id for e in traj.tool_events] == [c.id for c in traj.calls[0].tool_calls]
    assert art.ThreadStore(store).waiting() == []  # finished: nothing left waiting
    traj.reward = art.resume_reward(traj)
    seqs_group = art.TrajectoryGroup([traj, first.model_copy(update={"id": "x", "reward": 0.0})])
    result = await fresh_model.train([seqs_group])
    assert result.metrics["trajectories"] == 2


async def test_a_rejection_in_this_process_ends_the_same_trajectory(
    fresh_model: art.TrainableModel, tmp_path: Path
) -> None:
    db, store = tmp_path / "threads.sqlite", tmp_path / "store"
    first = await _start(fresh_model, db, store, "t-2")
    config = {"configurable": {"thread_id": "t-2"}}
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = approval_graph(fresh_model.chat_model(max_tokens=8), saver)
        with art.capture(thread=config, store=store) as traj:
            await graph.ainvoke(Command(resume={"type": "ignore"}), config)
    assert traj.id == first.id and [c.node for c in traj.calls] == ["agent"]
    assert art.resume_reward(traj) == 0.0 and not traj.tool_events


async def test_resuming_a_thread_whose_trajectory_is_missing_is_an_error(
    fresh_model: art.TrainableModel, tmp_path: Path
) -> None:
    db, store = tmp_path / "threads.sqlite", tmp_path / "store"
    await _start(fresh_model, db, store, "t-3")
    for f in store.iterdir():
        f.unlink()  # the trajectory is lost (another machine, a wiped folder)
    config = {"configurable": {"thread_id": "t-3"}}
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = approval_graph(fresh_model.chat_model(max_tokens=8), saver)
        lost = art.capture(thread=config, store=store)
        with pytest.raises(art.UsageError, match="holds no trajectory for it"), lost:
            await graph.ainvoke(Command(resume="approve"), config)


def test_resume_values_map_to_rewards() -> None:
    cases = {
        True: 1.0,
        "Approved": 1.0,
        "reject": 0.0,
        "edit": 0.5,
        json.dumps("x"): None,
    }
    for value, want in cases.items():
        if want is None:
            with pytest.raises(art.UsageError, match="cannot read a decision"):
                art.resume_reward(value)
        else:
            assert art.resume_reward(value) == want
    assert art.resume_reward({"type": "accept"}) == 1.0
    assert art.resume_reward([{"type": "edit"}]) == 0.5  # the agent inbox's list form
    assert art.resume_reward({"approved": False}) == 0.0
    assert art.resume_reward({"3f2a": "approve"}) == 1.0  # Command(resume={interrupt_id: v})
    assert art.resume_reward("approve", approve=2.0) == 2.0
    traj = art.Trajectory(resume_values=["approve", "reject"])
    assert art.resume_reward(traj) == 0.5
    with pytest.raises(art.UsageError, match="never resumed"):
        art.resume_reward(art.Trajectory())


def test_thread_files_stay_inside_the_store(tmp_path: Path) -> None:
    store = art.ThreadStore(tmp_path / "s")
    for tid in ["../../etc/passwd", "..", "a/b", "x" * 500]:
        f = store.file(tid)
        assert f.parent == store.path and not f.name.startswith(".")
    assert store.file("a/b") != store.file("a_b")  # two ids never share a file
    with pytest.raises(art.UsageError, match="go together"):
        art.capture(thread="t")
    with pytest.raises(art.UsageError, match="no thread id"):
        art.capture(thread={"configurable": {}}, store=tmp_path)
