"""Tests for art_langgraph.rewards.ruler: the prompt, reply checking, retries, and a real judge.

Three kinds of test:
- pure: `build_judge_messages` and `parse_judge_reply`, no server;
- a scripted fake OpenAI-compatible server on loopback (`FakeJudge`), which replies what
  each test tells it to. It proves nothing about the system; it is a deterministic unit
  test of the retry and response_format fallback logic, which a real model cannot drive
  on purpose;
- the real thing: our own server on the tiny preset as the judge (the shared `server`
  fixture of tests/conftest.py). Its weights are random, so its explanations are noise,
  but it answers `response_format` json_schema under constrained decoding, so its replies
  are valid and the whole path (litellm, schema, parsing, rescoring, gather) runs for real.

litellm's remote model-cost-map fetch is switched off (offline, and ~5 s faster to import).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("litellm")

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from art_langgraph import (
    InfrastructureError,
    LLMCall,
    ModelBehaviorError,
    Trajectory,
    TrajectoryGroup,
    UsageError,
    gather_trajectory_groups,
)
from art_langgraph.rewards import (
    DEFAULT_RUBRIC,
    RulerScore,
    build_judge_messages,
    parse_judge_reply,
    ruler,
    ruler_score_group,
)
from art_langgraph.serving import ServerHandle

TASK = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 17 + 25?"},
]
ANSWERS = ["42", "41", "I don't know."]
LISTS = [[*TASK, {"role": "assistant", "content": a}] for a in ANSWERS]
TIMEOUT_S = 120.0  # a guard against hangs; a judge call takes ~1-5 s on 2 busy CPU cores


def reply(*scores: float, ids: list[str] | None = None) -> str:
    ids = ids or [str(i) for i in range(1, len(scores) + 1)]
    return json.dumps(
        {
            "scores": [
                {"trajectory_id": i, "explanation": f"because {i}", "score": s}
                for i, s in zip(ids, scores, strict=True)
            ]
        }
    )


def group_of(rewards: list[float]) -> TrajectoryGroup:
    return TrajectoryGroup(
        Trajectory(messages=[*TASK, {"role": "assistant", "content": str(r)}], reward=r)
        for r in rewards
    )


def closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


# --- the prompt ---------------------------------------------------------------------------


def test_common_prefix_is_sent_once_and_trajectories_are_numbered() -> None:
    system, user = build_judge_messages(LISTS, "Correct sums win.")
    assert system["role"] == "system" and user["role"] == "user"
    assert "Correct sums win." in system["content"]
    assert '"1" to "3"' in system["content"]
    text = user["content"]
    assert text.count("What is 17 + 25?") == 1  # the shared task, once
    context = text.split("<context>\n")[1].split("\n</context>")[0]
    assert json.loads(context) == TASK
    for i, answer in enumerate(ANSWERS, 1):
        body = text.split(f'<trajectory id="{i}">\n')[1].split("\n</trajectory>")[0]
        assert json.loads(body) == [{"role": "assistant", "content": answer}]
    assert text.index('id="1"') < text.index('id="2"') < text.index('id="3"')


def test_no_shared_start_means_no_context() -> None:
    lists = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    _, user = build_judge_messages(lists)
    assert "<context>" not in user["content"]
    assert '"content": "a"' in user["content"] and '"content": "b"' in user["content"]


def test_prefix_never_takes_a_whole_conversation() -> None:
    same = [[*TASK, {"role": "assistant", "content": "42"}]] * 2
    _, user = build_judge_messages(same)
    for i in (1, 2):  # identical conversations still show what they ended with
        body = user["content"].split(f'<trajectory id="{i}">\n')[1].split("\n</trajectory>")[0]
        assert json.loads(body) == [{"role": "assistant", "content": "42"}]
    _, user = build_judge_messages([TASK, LISTS[0]])  # one is a prefix of the other
    body1 = user["content"].split('<trajectory id="1">\n')[1].split("\n</trajectory>")[0]
    assert json.loads(body1) == TASK[1:]


def test_default_rubric_is_in_the_prompt_and_bad_input_is_refused() -> None:
    system, _ = build_judge_messages(LISTS)
    assert DEFAULT_RUBRIC.strip() in system["content"]
    with pytest.raises(UsageError, match="at least one"):
        build_judge_messages([])
    with pytest.raises(UsageError, match="rubric"):
        build_judge_messages(LISTS, "  ")


# --- checking replies ----------------------------------------------------------------------


def test_parse_maps_ids_in_any_order_and_clamps() -> None:
    text = reply(1.7, 0.25, -0.5, ids=["3", "1", "2"])
    scores = parse_judge_reply(f"Here you are:\n```json\n{text}\n```\nDone.", 3)
    assert [s.trajectory_id for s in scores] == ["1", "2", "3"]
    assert [s.score for s in scores] == [0.25, 0.0, 1.0]
    assert scores[0] == RulerScore(trajectory_id="1", explanation="because 1", score=0.25)


def test_parse_accepts_integer_ids_and_prose_around_bare_json() -> None:
    text = json.dumps(
        {"scores": [{"trajectory_id": 2, "score": 1}, {"trajectory_id": 1, "score": 0}]}
    )
    scores = parse_judge_reply(f"My verdict: {text} -- thanks", 2)
    assert [(s.trajectory_id, s.score, s.explanation) for s in scores] == [
        ("1", 0.0, ""),
        ("2", 1.0, ""),
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ("not json at all", "not valid JSON"),
        ('{"scores": [{"trajectory_id": "1", "score": 0.5}', "not valid JSON"),
        ('{"verdict": 1}', 'no "scores" list'),
        (reply(0.5, 0.5), "has 2 scores; expected exactly 3"),
        (reply(0.5, 0.5, 0.5, 0.5), "has 4 scores; expected exactly 3"),
        (reply(0.5, 0.5, 0.5, ids=["1", "2", "4"]), "unknown trajectory_id '4'"),
        (reply(0.5, 0.5, 0.5, ids=["1", "2", "2"]), '"2" appears more than once'),
        (reply(0.5, float("nan"), 0.5), "is nan"),
        (reply(0.5, float("inf"), 0.5), "is inf"),
        (reply(0.5, 0.5, 0.5).replace("0.5}", '"high"}', 1), "'high'"),
        (reply(0.5, 0.5, 0.5).replace("0.5}", "true}", 1), "is True"),
        ('{"scores": [1, 2, 3]}', "not an object"),
    ],
)
def test_parse_says_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ModelBehaviorError, match=problem.replace("(", r"\(")):
        parse_judge_reply(text, 3)


# --- retries and fallbacks, against a scripted fake server ---------------------------------


class FakeJudge:
    """A scripted OpenAI-compatible chat endpoint on loopback, for unit tests of the retry logic.

    Not a proof of the system: it replies what `script` says, in order. Each item is the
    reply text, or `(status, message)` for an HTTP error; items may instead be callables
    of the request body. Every request body is kept in `requests`.
    """

    def __init__(self) -> None:
        self.script: list[Any] = []
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            item = self.script.pop(0) if self.script else (500, "script exhausted")
            if callable(item):
                item = item(body)
            if isinstance(item, tuple):
                status, message = item
                error = {"message": message, "type": "invalid_request_error", "code": None}
                return JSONResponse({"error": error}, status_code=status)
            return JSONResponse(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": item},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the fake judge did not start"
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def reset(self, *script: Any) -> None:
        self.script = list(script)
        self.requests = []

    def stop(self) -> None:
        self._server.should_exit = True
        self._server.force_exit = True  # litellm keeps connections alive; do not wait for them
        self._thread.join(10)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeJudge]:
    judge = FakeJudge()
    yield judge
    judge.stop()


async def fake_ruler(fake: FakeJudge, lists: list[list[dict[str, Any]]] = LISTS, **kw: Any) -> Any:
    call = ruler(lists, judge="openai/fake", base_url=fake.base_url, api_key="x", **kw)
    return await asyncio.wait_for(call, TIMEOUT_S)


async def test_asks_for_a_schema_with_exactly_n_scores(fake: FakeJudge) -> None:
    fake.reset(reply(0.9, 0.4, 0.0))
    scores = await fake_ruler(fake, extra_params={"max_tokens": 77})
    assert [s.score for s in scores] == [0.9, 0.4, 0.0]
    (request,) = fake.requests
    assert request["temperature"] == 0.0 and request["max_tokens"] == 77
    assert request["messages"] == build_judge_messages(LISTS)
    rf = request["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["name"] == "ruler_scores"
    array = rf["json_schema"]["schema"]["properties"]["scores"]
    assert array["minItems"] == array["maxItems"] == 3
    assert array["items"]["properties"]["trajectory_id"]["enum"] == ["1", "2", "3"]
    assert [p["properties"]["trajectory_id"]["const"] for p in array["prefixItems"]] == [
        "1",
        "2",
        "3",
    ]
    score = array["items"]["properties"]["score"]
    assert (score["type"], score["minimum"], score["maximum"]) == ("number", 0, 1)


async def test_a_wrong_count_is_answered_and_retried(fake: FakeJudge) -> None:
    fake.reset(reply(0.5, 0.5), reply(1.0, 0.2, 0.0))
    scores = await fake_ruler(fake)
    assert [s.score for s in scores] == [1.0, 0.2, 0.0]
    assert len(fake.requests) == 2
    *base, bad, feedback = fake.requests[1]["messages"]
    assert base == build_judge_messages(LISTS)
    assert bad == {"role": "assistant", "content": reply(0.5, 0.5)}
    assert feedback["role"] == "user"
    assert "has 2 scores; expected exactly 3" in feedback["content"]


async def test_gives_up_after_max_retries_with_the_last_reply(fake: FakeJudge) -> None:
    fake.reset(*["nope"] * 3)
    with pytest.raises(
        ModelBehaviorError, match=r"in 3 replies: the reply is not valid JSON.*'nope'"
    ):
        await fake_ruler(fake, max_retries=2)
    assert len(fake.requests) == 3


async def test_falls_back_when_the_provider_refuses_json_schema(fake: FakeJudge) -> None:
    def refuse_formats(body: dict[str, Any]) -> Any:
        if "response_format" in body:
            return (
                400,
                f"response_format of type {body['response_format']['type']} is not supported",
            )
        return "Sure!\n```json\n" + reply(0.3, 0.6, 0.1) + "\n```"

    fake.reset(*[refuse_formats] * 3)
    scores = await fake_ruler(fake)
    assert [s.score for s in scores] == [0.3, 0.6, 0.1]
    kinds = [(r.get("response_format") or {}).get("type") for r in fake.requests]
    assert kinds == ["json_schema", "json_object", None]


async def test_other_refusals_are_usage_errors_and_are_not_retried(fake: FakeJudge) -> None:
    fake.reset((401, "invalid api key"))
    with pytest.raises(UsageError, match="refused the request"):
        await fake_ruler(fake)
    assert len(fake.requests) == 1


async def test_transient_server_errors_are_retried(fake: FakeJudge) -> None:
    fake.reset((503, "overloaded"), reply(0.1, 0.2, 0.3))
    scores = await fake_ruler(fake, max_retries=1)
    assert [s.score for s in scores] == [0.1, 0.2, 0.3]
    assert len(fake.requests) == 2


async def test_a_failing_judge_drops_the_group_only_when_asked(
    fake: FakeJudge, caplog: pytest.LogCaptureFixture
) -> None:
    score = functools.partial(
        ruler_score_group, judge="openai/fake", base_url=fake.base_url, api_key="x", max_retries=0
    )
    fake.reset("garbage")
    with caplog.at_level(logging.WARNING, logger="art_langgraph.rewards.ruler"):
        assert await score(group_of([0.0, 1.0]), swallow_exceptions=True) is None
    assert "dropping the group" in caplog.text
    fake.reset("garbage")
    with pytest.raises(ModelBehaviorError):
        await score(group_of([0.0, 1.0]))
    with pytest.raises(UsageError, match="extra_params may not set"):  # misuse is never swallowed
        await score(group_of([0.0, 1.0]), swallow_exceptions=True, extra_params={"model": "x"})
    with pytest.raises(TypeError, match="max_retry"):
        await score(group_of([0.0, 1.0]), swallow_exceptions=True, max_retry=2)


def test_bad_arguments_are_refused_before_any_call() -> None:
    with pytest.raises(UsageError, match="max_retries"):
        asyncio.run(ruler(LISTS, judge="openai/x", max_retries=-1))
    with pytest.raises(UsageError, match=r"\['api_key'\]"):
        asyncio.run(ruler(LISTS, judge="openai/x", extra_params={"api_key": "k"}))


async def test_small_and_pending_groups() -> None:
    single = group_of([0.5])
    assert await ruler_score_group(single, judge="openai/unused") is single

    async def rollout() -> Trajectory:
        return Trajectory()

    pending = TrajectoryGroup([rollout()])
    with pytest.raises(UsageError, match="pending"):
        await ruler_score_group(pending, judge="openai/unused")
    await pending.resolve()  # no coroutine left un-awaited


# --- the real judge: our server on the tiny preset -----------------------------------------


def judge_kw(server: ServerHandle, n: int) -> dict[str, Any]:
    # explanation <= 200 chars and scores of 2 decimals bound a reply at ~250 tokens a score.
    return dict(
        judge="openai/tiny",
        base_url=server.base_url,
        api_key="x",
        extra_params={"max_tokens": 300 * n},
    )


async def test_real_judge_scores_every_trajectory(server: ServerHandle) -> None:
    scores = await asyncio.wait_for(ruler(LISTS, **judge_kw(server, 3)), TIMEOUT_S)
    assert [s.trajectory_id for s in scores] == ["1", "2", "3"]
    assert all(0.0 <= s.score <= 1.0 for s in scores)
    assert all(isinstance(s.explanation, str) for s in scores)


async def test_real_judge_rescores_a_group_and_keeps_the_old_rewards(server: ServerHandle) -> None:
    group = group_of([0.0, 0.5, 1.0])
    group.trajectories[0].log("rolled out")
    before = group.model_dump()
    scored = await asyncio.wait_for(ruler_score_group(group, **judge_kw(server, 3)), TIMEOUT_S)
    assert scored is not None and scored is not group
    assert group.model_dump() == before  # the input is untouched
    assert [t.id for t in scored] == [t.id for t in group]
    for old, new in zip(group, scored, strict=True):
        assert new.metrics["independent_reward"] == old.reward
        assert new.reward == new.metrics["ruler_score"]
        assert 0.0 <= new.reward <= 1.0
        assert len(new.logs) == len(old.logs) + 1 and new.logs[-1].startswith("RULER: ")


async def test_real_judge_as_after_each_of_gather(server: ServerHandle) -> None:
    async def rollout(answer: str) -> Trajectory:
        return Trajectory(messages=[*TASK, {"role": "assistant", "content": answer}], reward=0.5)

    groups = [TrajectoryGroup(rollout(a) for a in ANSWERS[:2]) for _ in range(2)]
    after_each = functools.partial(ruler_score_group, **judge_kw(server, 2))
    gathered = await asyncio.wait_for(
        gather_trajectory_groups(groups, after_each=after_each, progress=False), TIMEOUT_S
    )
    assert len(gathered) == 2
    for group in gathered:
        assert len(group) == 2
        assert all(t.metrics["independent_reward"] == 0.5 for t in group)
        assert all(t.reward == t.metrics["ruler_score"] for t in group)


async def test_unreachable_judge(caplog: pytest.LogCaptureFixture) -> None:
    kw: dict[str, Any] = dict(
        judge="openai/tiny", base_url=closed_port_url(), api_key="x", max_retries=1
    )
    with pytest.raises(InfrastructureError, match=r"did not answer \(2 attempts\)"):
        await asyncio.wait_for(ruler(LISTS, **kw), TIMEOUT_S)
    with caplog.at_level(logging.WARNING, logger="art_langgraph.rewards.ruler"):
        dropped = await ruler_score_group(group_of([0.0, 1.0]), swallow_exceptions=True, **kw)
    assert dropped is None and "dropping the group" in caplog.text
    groups = [TrajectoryGroup([Trajectory(reward=0.0), Trajectory(reward=1.0)])]
    after_each = functools.partial(ruler_score_group, swallow_exceptions=True, **kw)
    assert await gather_trajectory_groups(groups, after_each=after_each, progress=False) == []


# --- per node -------------------------------------------------------------------------------


def _node_group() -> TrajectoryGroup:
    def traj(i: int, with_agent: bool) -> Trajectory:
        router = LLMCall(
            node="router",
            namespace=["router"],
            messages=[{"role": "user", "content": "route 2+3"}],
            response_message={"role": "assistant", "content": f"route-{i}"},
        )
        agent = LLMCall(
            node="agent",
            namespace=["research", "agent"],
            messages=[{"role": "user", "content": "add 2 and 3"}],
            response_message={"role": "assistant", "content": f"answer-{i}"},
        )
        calls = [router, agent] if with_agent else [router]
        return Trajectory(messages=[*TASK, {"role": "assistant", "content": str(i)}], calls=calls)

    return TrajectoryGroup([traj(0, True), traj(1, True), traj(2, False)])


async def test_nodes_are_judged_on_their_own_into_node_rewards(fake: FakeJudge) -> None:
    fake.reset(reply(0.1, 0.2, 0.3), reply(0.9, 0.4, 0.0), reply(0.25, 0.75))
    scored = await ruler_score_group(
        _node_group(),
        judge="openai/fake",
        base_url=fake.base_url,
        api_key="x",
        nodes=["router", "research"],  # a subgraph's node covers the calls inside it
        node_rubrics={"router": "Pick the right route."},
    )
    assert scored is not None
    assert scored.rewards() == [0.1, 0.2, 0.3]  # the whole run, judged as before
    assert [t.node_rewards for t in scored] == [
        {"router": 0.9, "research": 0.25},
        {"router": 0.4, "research": 0.75},
        {"router": 0.0},  # no call in the subgraph: left out of its judging
    ]
    assert scored.trajectories[0].metrics["ruler_score/research"] == 0.25
    router_req, agent_req = fake.requests[1], fake.requests[2]
    assert "Pick the right route." in router_req["messages"][0]["content"]
    assert "route-1" in router_req["messages"][-1]["content"]
    judged = agent_req["messages"][-1]["content"]
    assert "answer-0" in judged and "answer-1" in judged and "route-" not in judged


async def test_node_rubrics_for_an_unnamed_node_are_refused() -> None:
    with pytest.raises(UsageError, match="node_rubrics names nodes"):
        await ruler_score_group(
            _node_group(), judge="openai/fake", nodes=["router"], node_rubrics={"agent": "x"}
        )
