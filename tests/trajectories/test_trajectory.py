"""Tests for art_langgraph.trajectories.trajectory: records, OpenAI capture, reward checks, JSONL io."""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from pydantic import ValidationError

from art_langgraph.errors import NonFiniteRewardError, UsageError
from art_langgraph.trajectories.trajectory import (
    ExceptionInfo,
    LLMCall,
    ToolCall,
    ToolEvent,
    Trajectory,
    TrajectoryGroup,
    append_jsonl,
    normalize_message,
    read_jsonl,
    write_jsonl,
)

NESTED_ARGS = {"query": "café ☕ 東京", "filters": {"tags": ["a", "b"], "limit": 3, "w": 0.1}}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "filters": {"default": None}},
                "required": ["query"],
            },
        },
    }
]

REQUEST: dict[str, Any] = {
    "model": "agent",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Find cafés in Tōkyō 🍵"},
    ],
    "tools": TOOLS,
    "tool_choice": "auto",
    "temperature": 0.7,
    "top_p": 0.95,
    "max_tokens": 64,
    "stop": ["</s>"],
    "seed": 7,
    "n": 2,
    "extra_body": {"top_k": 20, "return_token_ids": True},
    "extra_headers": {"X-Trace": "1"},
    "timeout": 30,
    "user": openai.NOT_GIVEN,
}

RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "agent@3",
    "prompt_token_ids": [1, 2, 3, 4],
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "token_ids": [10, 11, 12],
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "search", "arguments": json.dumps(NESTED_ARGS)},
                    }
                ],
            },
            "logprobs": {
                "content": [
                    {"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []},
                    {"token": "b", "logprob": -0.25, "bytes": [98], "top_logprobs": []},
                    {"token": "c", "logprob": 0.0, "bytes": [99], "top_logprobs": []},
                ]
            },
        },
        {
            "index": 1,
            "finish_reason": "length",
            "token_ids": [20],
            "message": {"role": "assistant", "content": "Hé"},
            "logprobs": {"content": [{"token": "Hé", "logprob": -1.5, "top_logprobs": []}]},
        },
    ],
    "usage": {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    },
}


def rich_trajectory() -> Trajectory:
    call = LLMCall.from_openai(
        REQUEST,
        ChatCompletion.model_validate(RESPONSE),
        latency_s=0.1,
        started_at=datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
    )
    t = Trajectory(
        messages=[
            *call.to_messages(),
            {"role": "tool", "tool_call_id": "call_1", "content": "☕ Café Ñandú\nline 2"},
        ],
        reward=0.1,
        metrics={"correct": True, "turns": 2, "score": 0.30000000000000004},
        metadata={"scenario": {"id": "s-1", "split": "train"}, "tags": ["x", "ÿ"]},
    )
    t.add_call(call)
    t.add_tool_event(
        ToolEvent(
            name="search",
            args=NESTED_ARGS,
            tool_call_id="call_1",
            result={"hits": [{"title": "Café", "score": 0.1}], "next": None},
            latency_s=1e-3,
        )
    )
    t.add_tool_event(ToolEvent(name="search", args="{not json", error="bad arguments"))
    t.log("first line")
    t.log("ünïcødé 🎉")
    try:
        raise RuntimeError("tool blew up")
    except RuntimeError as exc:
        t.exception = ExceptionInfo.from_exception(exc)
    return t.finish()


# ---- round trip ---------------------------------------------------------------------------


def test_jsonl_round_trip_is_lossless(tmp_path: Path) -> None:
    t1, t2 = rich_trajectory(), Trajectory(reward=-2)
    group = TrajectoryGroup([t1, t2], metadata={"step": 3, "prompt": "Tōkyō"})
    path = tmp_path / "trajectories.jsonl"

    assert write_jsonl(path, [t1, t2]) == 2
    back = read_jsonl(path)
    assert [t.model_dump(mode="json") for t in back] == [
        t1.model_dump(mode="json"),
        t2.model_dump(mode="json"),
    ]
    assert back[0] == t1
    assert back[0].calls[0].logprobs == [-0.1, -0.25, 0.0]
    assert back[0].tool_events[0].args == NESTED_ARGS
    assert back[0].tool_events[1].args == "{not json"
    assert back[0].metrics == {"correct": True, "turns": 2, "score": 0.30000000000000004}
    assert type(back[0].metrics["correct"]) is bool and type(back[0].metrics["turns"]) is int
    assert back[0].started_at.tzinfo is not None and back[0].finished_at == t1.finished_at

    text = path.read_text(encoding="utf-8")
    assert "Tōkyō" in text and "🎉" in text  # stored as UTF-8, not escaped
    assert len(text.splitlines()) == 2
    assert all(json.loads(line) for line in text.splitlines())

    gpath = tmp_path / "groups.jsonl"
    write_jsonl(gpath, [group])
    (gback,) = read_jsonl(gpath, kind=TrajectoryGroup)
    assert gback.model_dump(mode="json") == group.model_dump(mode="json")
    assert gback.rewards() == [0.1, -2.0]


def test_non_finite_logprobs_survive_the_round_trip(tmp_path: Path) -> None:
    t = Trajectory(calls=[LLMCall(completion_token_ids=[1, 2], logprobs=[float("-inf"), -0.5])])
    write_jsonl(tmp_path / "t.jsonl", [t])
    (back,) = read_jsonl(tmp_path / "t.jsonl")
    assert back.calls[0].logprobs == [float("-inf"), -0.5]


def test_append_jsonl_appends_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    ts = [Trajectory(reward=r) for r in (1.0, 0.5, 0.0)]
    for t in ts:
        append_jsonl(path, t)
    assert [t.id for t in read_jsonl(path)] == [t.id for t in ts]
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3


def test_read_jsonl_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(Trajectory().model_dump_json() + "\n\n" + '{"id": 3}\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"bad\.jsonl:3"):
        read_jsonl(path)


# ---- atomic write -------------------------------------------------------------------------


def test_atomic_write_leaves_no_temp_files_and_keeps_old_file_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl(path, [Trajectory(reward=1.0)])
    write_jsonl(path, [Trajectory(reward=2.0), Trajectory(reward=3.0)])  # overwrite
    assert os.listdir(tmp_path) == ["out.jsonl"]
    assert [t.reward for t in read_jsonl(path)] == [2.0, 3.0]
    assert path.stat().st_mode & 0o777 != 0o600  # not mkstemp's private mode

    def failing():
        yield Trajectory(reward=9.0)
        raise RuntimeError("disk full")

    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="disk full"):
        write_jsonl(path, failing())
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["out.jsonl"]


# ---- from_openai --------------------------------------------------------------------------


def test_from_openai_reads_a_chat_completion_object() -> None:
    completion = ChatCompletion.model_validate(RESPONSE)
    assert completion.model_extra == {"prompt_token_ids": [1, 2, 3, 4]}  # vLLM extras
    call = LLMCall.from_openai(REQUEST, completion, latency_s=0.25)

    assert call.type == "llm_call" and len(call.id) == 32
    assert call.messages == REQUEST["messages"]
    assert call.tools == TOOLS  # None inside a schema is kept
    assert call.tool_choice == "auto"
    assert call.sampling == {
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 64,
        "stop": ["</s>"],
        "seed": 7,
        "n": 2,
        "top_k": 20,
        "return_token_ids": True,
    }
    assert call.prompt_token_ids == [1, 2, 3, 4]
    assert call.completion_token_ids == [10, 11, 12]
    assert call.logprobs == [-0.1, -0.25, 0.0]
    assert call.model == "agent@3" and call.adapter_step == 3
    assert call.finish_reason == "tool_calls"
    assert call.latency_s == 0.25
    assert call.usage == {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "total_tokens": 8,
        "cached_tokens": 0,
    }
    assert call.response_message == {  # None fields (content, refusal, audio...) dropped
        "role": "assistant",
        "tool_calls": RESPONSE["choices"][0]["message"]["tool_calls"],
    }
    assert call.raw_response is not None and call.raw_response["id"] == "chatcmpl-1"
    assert call.raw_response["prompt_token_ids"] == [1, 2, 3, 4]
    assert call.trainable_token_count == 3
    (tool_call,) = call.tool_calls
    assert isinstance(tool_call, ToolCall) and tool_call.function.name == "search"
    assert tool_call.parsed_arguments() == NESTED_ARGS
    assert call.to_messages() == [*REQUEST["messages"], call.response_message]


def test_from_openai_keeps_cached_tokens_from_the_usage_details() -> None:
    response = json.loads(json.dumps(RESPONSE))
    response["usage"]["prompt_tokens_details"] = {"cached_tokens": 3}
    call = LLMCall.from_openai(REQUEST, ChatCompletion.model_validate(response))
    assert call.usage == {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "total_tokens": 8,
        "cached_tokens": 3,
    }


def test_from_openai_with_a_dict_matches_the_object() -> None:
    from_obj = LLMCall.from_openai(REQUEST, ChatCompletion.model_validate(RESPONSE))
    from_dict = LLMCall.from_openai(REQUEST, json.loads(json.dumps(RESPONSE)))
    assert from_dict.model_dump(exclude={"id", "raw_response"}) == from_obj.model_dump(
        exclude={"id", "raw_response"}
    )
    assert from_dict.raw_response == RESPONSE


def test_from_openai_second_choice_and_missing_token_ids() -> None:
    call = LLMCall.from_openai(REQUEST, RESPONSE, choice_index=1)
    assert call.completion_token_ids == [20] and call.logprobs == [-1.5]
    assert call.response_message == {"role": "assistant", "content": "Hé"}
    assert call.finish_reason == "length"

    plain = json.loads(json.dumps(RESPONSE))
    del plain["prompt_token_ids"]
    for choice in plain["choices"]:
        del choice["token_ids"]
        choice["logprobs"] = None
    call = LLMCall.from_openai({"messages": []}, ChatCompletion.model_validate(plain))
    assert call.prompt_token_ids is None and call.completion_token_ids is None
    assert call.logprobs is None and call.trainable_token_count == 0

    with pytest.raises(UsageError, match="choice_index 5 is out of range"):
        LLMCall.from_openai(REQUEST, RESPONSE, choice_index=5)


def test_from_openai_drops_logprobs_that_are_not_one_per_token() -> None:
    """A provider that reports logprobs per text piece: the ids are kept (the call still
    trains), the misaligned logprobs are not; the payload is kept as sent."""
    pieces = json.loads(json.dumps(RESPONSE))
    pieces["choices"][0]["logprobs"] = {"content": [{"token": "ab", "logprob": -0.3}]}
    call = LLMCall.from_openai(REQUEST, pieces)
    assert call.completion_token_ids == [10, 11, 12] and call.logprobs is None
    assert call.raw_response == pieces and call.trainable_token_count == 3


def test_from_openai_accepts_openai_message_objects_in_the_request() -> None:
    previous = ChatCompletionMessage(role="assistant", content="earlier answer")
    request = {"messages": [{"role": "user", "content": "hi"}, previous], "model": "agent"}
    call = LLMCall.from_openai(request, RESPONSE)
    assert call.messages[1] == {"role": "assistant", "content": "earlier answer"}
    json.dumps(call.model_dump(mode="json"))  # everything is JSON


def test_completion_ids_and_logprobs_must_align() -> None:
    with pytest.raises(ValidationError, match="completion_token_ids has 3 ids but logprobs has 2"):
        LLMCall(completion_token_ids=[1, 2, 3], logprobs=[-0.1, -0.2])
    assert LLMCall(completion_token_ids=[1, 2], logprobs=None).trainable_token_count == 2
    assert LLMCall(completion_token_ids=[1, 2], trainable=False).trainable_token_count == 0


@pytest.mark.parametrize(
    ("model", "given", "expected"),
    [("agent@12", None, 12), ("agent", None, None), ("a@b@7", None, 7), ("agent@3", 5, 5)],
)
def test_adapter_step_is_parsed_from_the_model_name(
    model: str, given: int | None, expected: int | None
) -> None:
    assert LLMCall(model=model, adapter_step=given).adapter_step == expected


# ---- reward validation --------------------------------------------------------------------

BAD_REWARDS = [float("nan"), float("inf"), float("-inf"), None, "x", "1.0", True, [1.0]]


@pytest.mark.parametrize("reward", BAD_REWARDS)
def test_bad_reward_rejected_on_construction(reward: Any) -> None:
    with pytest.raises(NonFiniteRewardError, match="traj-1") as info:
        Trajectory(id="traj-1", reward=reward)
    assert info.value.trajectory_id == "traj-1"


def test_bad_reward_names_a_generated_id() -> None:
    with pytest.raises(NonFiniteRewardError) as info:
        Trajectory(reward=float("nan"))
    assert len(info.value.trajectory_id) == 32
    assert info.value.trajectory_id in str(info.value)


@pytest.mark.parametrize("reward", BAD_REWARDS)
def test_bad_reward_rejected_on_assignment(reward: Any) -> None:
    t = Trajectory(id="traj-2", reward=0.5)
    with pytest.raises(NonFiniteRewardError, match="traj-2"):
        t.reward = reward
    assert t.reward == 0.5


def test_bad_reward_rejected_when_loading(tmp_path: Path) -> None:
    with pytest.raises(NonFiniteRewardError, match="v-1"):
        Trajectory.model_validate({"id": "v-1", "reward": None})
    with pytest.raises(NonFiniteRewardError, match="v-2"):
        Trajectory.model_validate_json('{"id": "v-2", "reward": NaN}')
    with pytest.raises(NonFiniteRewardError, match="v-3"):
        TrajectoryGroup.model_validate({"trajectories": [{"id": "v-3", "reward": "x"}]})
    with pytest.raises(NonFiniteRewardError, match="v-4"):
        TrajectoryGroup([{"id": "v-4", "reward": float("inf")}])
    path = tmp_path / "nan.jsonl"
    path.write_text('{"id": "v-5", "reward": Infinity}\n', encoding="utf-8")
    with pytest.raises(NonFiniteRewardError, match="v-5"):
        read_jsonl(path)


def test_good_rewards_are_stored_as_float() -> None:
    t = Trajectory(reward=1)
    assert t.reward == 1.0 and type(t.reward) is float
    t.reward = -3
    assert type(t.reward) is float and t.reward == -3.0
    assert math.isclose(Trajectory(reward=0.1).reward, 0.1)


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="rewrd"):
        Trajectory(rewrd=1.0)


# ---- groups -------------------------------------------------------------------------------


def test_group_from_a_list() -> None:
    ts = [Trajectory(reward=r) for r in (1.0, 0.0, 0.5)]
    group = TrajectoryGroup(ts)
    assert len(group) == 3 and list(group) == ts
    assert group.rewards() == [1.0, 0.0, 0.5]
    assert not group.pending and group.awaitables() == []
    assert TrajectoryGroup(trajectories=ts).trajectories == ts
    with pytest.raises(UsageError, match="not both"):
        TrajectoryGroup(ts, trajectories=ts)


async def test_group_from_coroutines(tmp_path: Path) -> None:
    async def rollout(i: int) -> Trajectory:
        if i == 2:
            raise ValueError("rollout 2 failed")
        return Trajectory(reward=i / 10, metadata={"i": i})

    group = TrajectoryGroup(rollout(i) for i in range(4))
    assert group.pending and len(group) == 0 and len(group.awaitables()) == 4
    with pytest.raises(UsageError, match="4 pending awaitables"):
        group.model_dump_json()
    with pytest.raises(UsageError, match="pending"):
        group.model_dump()
    with pytest.raises(UsageError, match="pending"):
        write_jsonl(tmp_path / "g.jsonl", [group])
    assert os.listdir(tmp_path) == []

    assert await group.resolve() is group
    assert not group.pending
    assert group.rewards() == [0.0, 0.1, 0.3]
    (err,) = group.exceptions
    assert err.type == "ValueError" and err.message == "rollout 2 failed"
    assert "rollout" in err.traceback
    write_jsonl(tmp_path / "g.jsonl", [group])
    (back,) = read_jsonl(tmp_path / "g.jsonl", kind=TrajectoryGroup)
    assert back.model_dump(mode="json") == group.model_dump(mode="json")


async def test_group_rejects_a_rollout_returning_something_else() -> None:
    async def bad() -> Any:
        return {"reward": 1.0}

    group = TrajectoryGroup([bad()])
    with pytest.raises(UsageError, match="returned dict"):
        await group.resolve()


def test_group_takes_exceptions_in_the_items() -> None:
    group = TrajectoryGroup([Trajectory(reward=1.0), KeyError("k")])
    assert len(group) == 1
    assert group.exceptions[0].type == "KeyError"


# ---- exceptions, messages, tool events ----------------------------------------------------


class CustomError(Exception):
    pass


def test_exception_capture() -> None:
    def inner() -> None:
        raise CustomError("deep failure ☠")

    try:
        inner()
    except CustomError as exc:
        info = ExceptionInfo.from_exception(exc)
    assert info.type == f"{__name__}.CustomError"
    assert info.message == "deep failure ☠"
    assert "inner" in info.traceback and "CustomError: deep failure" in info.traceback
    assert ExceptionInfo.from_exception(ValueError("never raised")).type == "ValueError"


def test_normalize_message() -> None:
    msg = ChatCompletionMessage(role="assistant", content="hi")
    assert normalize_message(msg) == {"role": "assistant", "content": "hi"}
    assert normalize_message(
        {"role": "tool", "content": "ok", "name": None, "tool_call_id": "c", "extra": (1, 2)}
    ) == {"role": "tool", "content": "ok", "tool_call_id": "c", "extra": [1, 2]}
    with pytest.raises(UsageError, match="cannot read a chat message from int"):
        normalize_message(3)


def test_trajectory_messages_are_normalized() -> None:
    t = Trajectory(messages=[ChatCompletionMessage(role="assistant", content="x")])
    assert t.messages == [{"role": "assistant", "content": "x"}]
    t.messages = [{"role": "user", "content": "y", "name": None}]
    assert t.messages == [{"role": "user", "content": "y"}]


def test_tool_event_result_becomes_json() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "<opaque>"

    event = ToolEvent(name="t", result={"obj": Opaque(), "items": (1, 2), "none": None})
    assert event.result == {"obj": "<opaque>", "items": [1, 2], "none": None}
    assert event.type == "tool_event"
    json.dumps(event.model_dump(mode="json"))


def test_trajectory_helpers() -> None:
    t = Trajectory()
    assert t.finished_at is None and t.started_at.tzinfo is not None
    t.log("hello")
    assert t.logs == ["hello"]
    assert t.finish() is t and t.finished_at is not None and t.finished_at >= t.started_at
    call = t.add_call(LLMCall())
    event = t.add_tool_event(ToolEvent(name="x"))
    assert t.calls == [call] and t.tool_events == [event]


def test_tool_call_parsed_arguments_keeps_invalid_text() -> None:
    call = ToolCall.model_validate(
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
    )
    assert call.parsed_arguments() == "{oops"
