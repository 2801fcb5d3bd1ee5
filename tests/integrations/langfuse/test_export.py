"""Langfuse export and review, against a local receiver of Langfuse's public API.

The receiver (`receiver.py`) stands in for a Langfuse server: the OTLP traces
endpoint (protobuf decoded with opentelemetry-proto), score create and list, projects.
What a Langfuse server would store is asserted on it: observation types and nesting,
`name@step` as the model, usage, recorded times, scores with comments, idempotent
re-export. The rollouts are real: a LangGraph agent on the warm-started tiny model, and
plain OpenAI-client rollouts through the real server; training steps are real.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from langchain.agents import create_agent

import art_langgraph as art
from art_langgraph.integrations.langfuse import (
    LangfuseLogger,
    approved_sft_file,
    export_folder,
    import_scores,
    trace_id_for,
)
from art_langgraph.integrations.langfuse.folder import EXPORTS_FILE
from art_langgraph.serving.runner import ServerHandle, start_app_server
from tests.backend.rollouts import rollout
from tests.integrations.langfuse.receiver import PROJECT_ID, Receiver, base_url
from tests.langgraph.tools import TOOLS, explode, one_tool_call_graph

ROOT = Path(__file__).resolve().parents[3]


def _logger(handle: ServerHandle, **kw: object) -> LangfuseLogger:
    return LangfuseLogger(
        public_key="pk-test", secret_key="sk-test", base_url=base_url(handle), **kw
    )


def _env(handle: ServerHandle) -> dict[str, str]:
    return {
        "LANGFUSE_PUBLIC_KEY": "pk-test",
        "LANGFUSE_SECRET_KEY": "sk-test",
        "LANGFUSE_BASE_URL": base_url(handle),
    }


async def _graph_rollouts(model: art.TrainableModel, n: int) -> list[art.Trajectory]:
    """A LangGraph graph: one forced tool call (every third one to a tool that raises)."""
    llm = model.chat_model(max_tokens=48, temperature=0.7)

    async def run(i: int) -> art.Trajectory:
        choice = "explode" if i % 3 == 2 else "required"
        graph = one_tool_call_graph(llm.bind_tools([*TOOLS, explode], tool_choice=choice))
        with art.capture(metadata={"scenario": f"q{i}"}) as traj:
            await graph.ainvoke({"messages": [("user", f"What is {i} plus {i + 2}?")]})
        traj.reward = float(i % 2)
        return traj

    return list(await asyncio.gather(*(run(i) for i in range(n))))


def _judged(t: art.Trajectory, score: float) -> art.Trajectory:
    """What `ruler_score_group` leaves on a trajectory (see rewards/ruler.py)."""
    t.metrics["independent_reward"] = t.reward
    t.metrics["ruler_score"] = score
    t.reward = score
    t.log(f"RULER: the agent {'answered' if score > 0.5 else 'did not answer'} the sum")
    return t


async def test_every_rollout_of_a_graph_becomes_a_trace(
    tool_model: art.TrainableModel,
    lg_backend: art.LocalBackend,
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    rec, handle = receiver
    trajs = await _graph_rollouts(tool_model, 6)
    trajs = [_judged(t, 0.25 * (i % 4)) for i, t in enumerate(trajs)]
    groups = [art.TrajectoryGroup(trajs[:3]), art.TrajectoryGroup(trajs[3:])]
    logger = _logger(handle)
    lg_backend.loggers.loggers.append(logger)
    try:
        await tool_model.log(groups, split="val")
    finally:
        lg_backend.loggers.loggers.remove(logger)
    assert logger.flush(30)
    step = await tool_model.get_step()
    assert logger.report.batches == 1 and not logger.report.failed_batches

    # the saved trajectories carry their trace id and URL
    folder = lg_backend.path / "lg" / "models" / "toolagent"
    saved = [t for g in art.read_groups(folder / f"trajectories/val/{step:04d}.jsonl") for t in g]
    assert len(saved) == 6 and len(rec.traces) == 6
    for t in saved:
        tid = t.metadata["langfuse_trace_id"]
        assert tid == trace_id_for(t) and tid in rec.traces
        assert (
            t.metadata["langfuse_trace_url"]
            == f"{base_url(handle)}/project/{PROJECT_ID}/traces/{tid}"
        )

    tools_seen = errors = 0
    for t in saved:
        trace = rec.traces[t.metadata["langfuse_trace_id"]]
        assert {"art", "model:toolagent", "split:val", f"step:{step}"} <= set(trace["tags"])
        assert trace["metadata"]["scenario"] == t.metadata["scenario"]
        assert trace["metadata"]["group"] in (0, 1) and trace["session_id"].endswith(
            f"val/step-{step}"
        )
        obs = rec.trace_observations(trace["id"])
        root = [o for o in obs if o["parent_id"] is None]
        assert len(root) == 1 and root[0]["type"] == "AGENT" and root[0]["name"] == "rollout"
        gens = [o for o in obs if o["type"] == "GENERATION"]
        tools = [o for o in obs if o["type"] == "TOOL"]
        assert len(gens) == len(t.calls) >= 1 and len(tools) == len(t.tool_events)
        tools_seen += len(tools)
        for o in gens + tools:
            assert o["parent_id"] == root[0]["id"]
        for gen, call in zip(gens, t.calls, strict=True):
            assert gen["model"] == call.model == f"toolagent@{step}"
            assert gen["usage"]["output"] == len(call.completion_token_ids or [])
            assert gen["usage"]["input"] == len(call.prompt_token_ids or [])
            assert gen["input"] == call.messages and gen["output"] == call.response_message
            assert call.started_at is not None and call.latency_s is not None
            assert gen["start_ns"] == int(
                call.started_at.timestamp() * 1e9
            )  # recorded, not export time
            assert gen["end_ns"] - gen["start_ns"] == pytest.approx(call.latency_s * 1e9, abs=1e3)
        for tool, ev in zip(tools, t.tool_events, strict=True):
            assert tool["name"] == ev.name and tool["input"] == ev.args
            if ev.error:
                errors += 1
                assert tool["level"] == "ERROR" and "boom" in tool["status_message"]
                assert tool["output"] == {"error": ev.error}
            else:
                assert tool["output"] == ev.result and tool["level"] == "DEFAULT"
        assert root[0]["start_ns"] <= min(o["start_ns"] for o in gens)
        scores = {s["name"]: s for s in rec.scores.values() if s["traceId"] == trace["id"]}
        assert scores["reward"]["value"] == t.reward
        assert scores["independent_reward"]["value"] == t.metrics["independent_reward"]
        assert scores["ruler_score"]["comment"].startswith("the agent")
    assert tools_seen >= 6 and errors >= 2  # every rollout calls a tool; two are forced to fail

    # re-export is idempotent: same observation and score ids, nothing added
    counts = (len(rec.observations), len(rec.scores), len(rec.traces))
    posts = rec.span_posts
    report = export_folder(folder, step=step, config=logger.config)
    assert report.trajectories >= 6 and rec.span_posts > posts
    assert (len(rec.observations), len(rec.scores), len(rec.traces)) == counts
    posts = rec.span_posts
    small = logger.config.model_copy(update={"max_request_bytes": 1})  # one trajectory a request
    one_file = export_folder(folder / f"trajectories/val/{step:04d}.jsonl", config=small)
    assert one_file.trajectories == 6 and one_file.batches == 1 and rec.span_posts == posts + 6
    assert (len(rec.observations), len(rec.scores), len(rec.traces)) == counts


async def test_training_exports_and_never_fails_on_a_broken_server(
    lg_backend: art.LocalBackend,
    receiver: tuple[Receiver, ServerHandle],
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec, handle = receiver
    model = art.TrainableModel(name="lf-train", project="lg", base_model="tiny")
    await model.register(lg_backend)
    folder = lg_backend.path / "lg" / "models" / "lf-train"

    async def groups() -> list[art.TrajectoryGroup]:
        trajs = await asyncio.gather(*(rollout(model, f"Say {i}") for i in range(6)))
        for i, t in enumerate(trajs):
            t.reward = float(i % 3)
        return [art.TrajectoryGroup(trajs[:3]), art.TrajectoryGroup(trajs[3:])]

    logger = _logger(handle)
    lg_backend.loggers.loggers.append(logger)
    try:
        result = await model.train(await groups(), art.TrainConfig(learning_rate=1e-3))
        assert logger.flush(30) and logger.report.batches == 1
        train_traces = {
            tid for tid, tr in rec.traces.items() if f"step:{result.step}" in tr["tags"]
        }
        assert len(train_traces) == 6
        gens = [
            o
            for o in rec.observations.values()
            if o["trace_id"] in train_traces and o["type"] == "GENERATION"
        ]
        assert {g["model"] for g in gens} == {
            f"lf-train@{result.step - 1}"
        }  # the step that sampled

        # the server fails: the step trains anyway, with one warning, and nothing is lost
        rec.fail_with = 500
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="art_langgraph"):
            r2 = await model.train(await groups(), art.TrainConfig(learning_rate=1e-3))
            assert logger.flush(30)
            handle.stop()  # then no server at all
            r3 = await model.train(await groups(), art.TrainConfig(learning_rate=1e-3))
            assert logger.flush(60)
        assert (r2.step, r3.step) == (result.step + 1, result.step + 2)
        warnings = [r for r in caplog.records if "Langfuse export" in r.getMessage()]
        assert len(warnings) == 1 and "art-langgraph langfuse export" in warnings[0].getMessage()
        assert sorted(logger.report.failed_batches) == [("train", r2.step), ("train", r3.step)]
        for s in (r2.step, r3.step):  # the JSONL has them, with their trace ids
            saved = art.read_groups(folder / f"trajectories/train/{s:04d}.jsonl")
            assert all("langfuse_trace_id" in t.metadata for g in saved for t in g)
    finally:
        lg_backend.loggers.loggers.remove(logger)
        logger.close()

    # a server again: `art-langgraph langfuse export` sends exactly the missed batches
    rec.fail_with = None
    back = start_app_server(rec.app())
    try:
        before = len(rec.traces)
        out = subprocess.run(
            [sys.executable, "-m", "art_langgraph.cli", "langfuse", "export", str(folder)],
            env={**os.environ, **_env(back)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "2 batches, 12 trajectories" in out.stdout, out.stdout
        assert len(rec.traces) == before + 12
        exported = [json.loads(x) for x in (folder / EXPORTS_FILE).read_text().splitlines()]
        assert sorted(e["step"] for e in exported) == [result.step, r2.step, r3.step]
    finally:
        back.stop()


async def test_review_scores_become_rewards_and_an_sft_file(
    lg_backend: art.LocalBackend,
    receiver: tuple[Receiver, ServerHandle],
    tmp_path: Path,
) -> None:
    rec, handle = receiver
    model = art.TrainableModel(name="lf-review", project="lg", base_model="tiny")
    await model.register(lg_backend)
    folder = lg_backend.path / "lg" / "models" / "lf-review"
    trajs = list(await asyncio.gather(*(rollout(model, f"Count to {i}") for i in range(8))))
    groups = [art.TrajectoryGroup(trajs[i : i + 4]) for i in (0, 4)]
    logger = _logger(handle)
    lg_backend.loggers.loggers.append(logger)
    try:
        await model.log(groups, split="train")  # exported for review, not trained yet
    finally:
        lg_backend.loggers.loggers.remove(logger)
        logger.close()
    ids = [trace_id_for(t) for t in trajs]
    # a reviewer scores three traces of the first group by hand, one of them in a queue,
    # and one trace that this folder never exported
    rec.annotate(ids[0], "human", 1.0, comment="right answer")
    rec.annotate(ids[1], "human", 0.0, comment="wrong")
    rec.annotate(ids[2], "human", True, queue_id="q-1")
    rec.annotate("f" * 32, "human", 1.0)
    rec.annotate(ids[3], "human", "meh")  # categorical: unusable without a value map
    rec.annotate(ids[4], "helpfulness", 1.0)  # another score name: not asked for

    result = import_scores(folder, name="human", config=logger.config)
    assert result.applied == 3 and result.dropped == 1  # the "meh" one, unusable
    assert [s.trace_id for s in result.unmatched] == ["f" * 32]
    assert [s.value for s in result.unusable] == ["meh"]
    assert len(result.groups) == 1
    reviewed = result.groups[0].trajectories
    assert [t.reward for t in reviewed] == [1.0, 0.0, 1.0]
    assert reviewed[0].metadata["review"]["comment"] == "right answer"
    assert reviewed[2].metadata["review"]["queue_id"] == "q-1"
    assert "reward_before_review" in reviewed[0].metrics

    by_map = import_scores(folder, name="human", value_map={"meh": 0.5}, config=logger.config)
    assert by_map.applied == 4 and by_map.groups[0].trajectories[3].reward == 0.5
    queue_only = import_scores(  # q-1 is not a queue the receiver knows: no status to ask
        folder, queue_id="q-1", source=None, config=logger.config, completed_only=False
    )
    assert queue_only.applied == 1

    # approved -> an SFT file train_sft takes; the reviewed group trains a real step
    n = approved_sft_file(result, tmp_path / "approved.jsonl")
    approved = art.read_jsonl(tmp_path / "approved.jsonl")
    assert n == 2 and [t.id for t in approved] == [trajs[0].id, trajs[2].id]
    step = await model.get_step()
    res = await model.train(result.groups, art.TrainConfig(learning_rate=1e-3))
    assert res.step == step + 1 and res.metrics["trajectories"] == 3
    sft = await model.train_sft(approved, epochs=1, batch_size=2)
    assert sft.step == step + 2

    # the same through the command line, reading keys from the environment
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "art_langgraph.cli",
            "langfuse",
            "import-scores",
            str(folder),
            "--name",
            "human",
            "--out",
            str(tmp_path / "reviewed.jsonl"),
            "--approved-sft",
            str(tmp_path / "sft.jsonl"),
        ],
        env={**os.environ, **_env(handle)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "3 trajectories rescored in 1 groups" in out.stdout
    assert "1 scores name traces not in" in out.stdout  # reported, not dropped silently
    assert len(art.read_groups(tmp_path / "reviewed.jsonl")) == 1
    assert len(art.read_jsonl(tmp_path / "sft.jsonl")) == 2


async def test_a_graph_traced_by_the_users_callback_handler_is_linked_not_duplicated(
    tool_model: art.TrainableModel,
    lg_backend: art.LocalBackend,
    receiver: tuple[Receiver, ServerHandle],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec, handle = receiver
    for k, v in _env(handle).items():
        monkeypatch.setenv(k, v)
    from langfuse import Langfuse
    from langfuse.langchain import CallbackHandler

    client = Langfuse()  # the user's own client, from the environment
    handler = CallbackHandler()
    agent = create_agent(tool_model.chat_model(max_tokens=48, temperature=0.0), tools=TOOLS)
    with art.capture() as traj, contextlib.suppress(Exception):
        await agent.ainvoke(
            {"messages": [("user", "What is 2 plus 3?")]},
            {"recursion_limit": 6, "callbacks": [handler]},
        )
    client.flush()
    linked = traj.metadata.get("langfuse_linked_trace_id")
    assert linked is not None and linked == handler.last_trace_id
    users = [o for o in rec.observations.values() if o["trace_id"] == linked]
    assert any(o["type"] == "GENERATION" for o in users)  # the handler's own trace arrived
    n_user = len(users)

    traj.reward = 1.0
    logger = _logger(handle)
    lg_backend.loggers.loggers.append(logger)
    try:
        await tool_model.log([art.TrajectoryGroup([traj])], split="linked")
    finally:
        lg_backend.loggers.loggers.remove(logger)
        logger.close()
    assert set(rec.traces) >= {linked} and trace_id_for(traj) == linked
    ours = [
        o
        for o in rec.observations.values()
        if o["trace_id"] == linked and o["scope"] == "art_langgraph"
    ]
    assert [o["name"] for o in ours] == ["art trajectory"]  # one span, no duplicated turns
    assert len([o for o in rec.observations.values() if o["trace_id"] == linked]) == n_user + 1
    assert "split:linked" in rec.traces[linked]["tags"]
    assert {s["name"] for s in rec.scores.values() if s["traceId"] == linked} == {"reward"}
    client.shutdown()


async def test_a_remote_backend_exports_from_the_client(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    from tests.backend.test_remote import KEY, Backend, _free_port

    rec, handle = receiver
    server = Backend(tmp_path, _free_port()).start()
    try:
        backend = art.RemoteBackend(server.url, api_key=KEY, loggers=[_logger(handle)])
        model = art.TrainableModel(name="lf-remote", project="r", base_model="tiny")
        await model.register(backend)
        trajs = [await rollout(model, f"count to {i}", seed=i) for i in range(4)]
        for i, t in enumerate(trajs):
            t.reward = float(i % 2)
        result = await model.train([art.TrajectoryGroup(trajs)], art.TrainConfig())
        await backend.close()  # flushes the logger
        assert {f"step:{result.step}" in tr["tags"] for tr in rec.traces.values()} == {True}
        assert len(rec.traces) == 4
        saved = art.read_groups(
            tmp_path / f"r/models/lf-remote/trajectories/train/{result.step:04d}.jsonl"
        )
        assert {t.metadata["langfuse_trace_id"] for g in saved for t in g} == set(rec.traces)
    finally:
        server.stop()
