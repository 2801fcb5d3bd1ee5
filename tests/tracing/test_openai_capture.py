"""Capture beyond LangChain: a plain `AsyncOpenAI` tool loop through `model.openai_client()`,
recorded token-exactly inside `art.capture()`, then trained on; the same over the Responses
API, streamed too, and an OpenAI Agents SDK agent on its default (Responses) model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import art_langgraph as art
from art_langgraph.tracing.openai_capture import merge_stream_chunks

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "The answer to the user's sum.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


@pytest.fixture(scope="module")
async def model(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.TrainableModel]:
    async with art.LocalBackend(path=tmp_path_factory.mktemp("oc")) as backend:
        m = art.TrainableModel(name="plain", project="oc", base_model="tiny")
        await m.register(backend)
        yield m


async def _tool_loop(model: art.TrainableModel, seed: int) -> tuple[art.Trajectory, list[Any]]:
    """A hand-written agent loop: a forced tool call, the tool's result, a final answer."""
    client = model.openai_client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    responses = []
    with art.capture(metadata={"seed": seed}) as traj:
        first = await client.chat.completions.create(
            model=model.name, messages=messages, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
            max_tokens=40, seed=seed,
        )  # fmt: skip
        responses.append(first)
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert json.loads(call.function.arguments) == {}  # type: ignore[union-attr]
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
        final = await client.chat.completions.create(
            model=model.name, messages=messages, tools=TOOLS, tool_choice="none",  # type: ignore[arg-type]
            max_tokens=8, seed=seed,
        )  # fmt: skip
        responses.append(final)
        traj.reward = 1.0 if "5" in (final.choices[0].message.content or "") else float(seed % 2)
    return traj, responses


async def test_a_plain_openai_tool_loop_is_captured_token_exactly(
    model: art.TrainableModel,
) -> None:
    traj, responses = await _tool_loop(model, seed=1)
    assert len(traj.calls) == 2 and traj.finished_at is not None
    for call, r in zip(traj.calls, responses, strict=True):
        extra = r.model_extra or {}
        choice_extra = r.choices[0].model_extra or {}
        assert call.prompt_token_ids == extra["prompt_token_ids"]
        assert call.completion_token_ids == choice_extra["token_ids"]
        assert call.logprobs == choice_extra["token_logprobs"]
        assert len(call.logprobs) == len(call.completion_token_ids or [])
        assert r.choices[0].logprobs is None  # the caller's response stays as it asked
        assert call.trainable and call.model == "plain@0" and call.adapter_step == 0
    assert traj.calls[0].tools == TOOLS and traj.calls[0].tool_choice == "required"
    assert traj.calls[0].response_message["tool_calls"][0]["function"]["name"] == "calculator"
    assert traj.calls[1].messages[-1]["role"] == "tool"
    assert traj.metadata == {"seed": 1}
    # the tool result sent back is a tool event, paired with the call by its id
    (event,) = traj.tool_events
    first_call = traj.calls[0].response_message["tool_calls"][0]
    assert event.tool_call_id == first_call["id"] and event.name == "calculator"
    assert event.args == {} and event.result == "5" and event.error is None


async def test_the_langchain_and_openai_paths_record_a_call_alike(
    model: art.TrainableModel,
) -> None:
    """One capture path: one seeded request, sent through the openai client and through the
    LangChain chat model, goes through the same capturing transport and records the same
    call field for field, each with the payload as the server sent it."""
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    client = model.openai_client()
    kwargs: dict[str, Any] = dict(max_tokens=40, seed=5)
    # warm the prefix cache: both calls below then find the prompt in it alike
    await client.chat.completions.create(model=model.name, messages=messages, **kwargs)  # type: ignore[arg-type]
    with art.capture() as wire:
        await client.chat.completions.create(
            model=model.name, messages=messages, tools=TOOLS, tool_choice="required", **kwargs  # type: ignore[arg-type]
        )  # fmt: skip
    llm = model.chat_model(**kwargs).bind_tools(TOOLS, tool_choice="required")
    with art.capture() as chain:
        await llm.ainvoke(messages)
    (a,), (b,) = wire.calls, chain.calls
    same = ("messages", "tools", "tool_choice", "prompt_token_ids", "completion_token_ids")
    same += ("model", "adapter_step", "finish_reason", "usage", "trainable")
    assert {f: getattr(b, f) for f in same} == {f: getattr(a, f) for f in same}
    assert a.usage is not None and "cached_tokens" in a.usage
    assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert [c["function"] for c in b.response_message["tool_calls"]] == [
        c["function"] for c in a.response_message["tool_calls"]
    ]
    assert b.sampling["seed"] == a.sampling["seed"] == 5
    assert a.raw_response is not None and b.raw_response is not None
    assert b.raw_response["choices"][0]["token_ids"] == b.completion_token_ids


RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]  # Responses' flat form


async def test_a_responses_tool_loop_is_captured_token_exactly(
    model: art.TrainableModel,
) -> None:
    client = model.openai_client()
    question = {"role": "user", "content": "What is 2 + 3?"}
    with art.capture() as traj:
        first = await client.responses.create(
            model=model.name, input=[question], tools=RESPONSES_TOOLS, tool_choice="required",  # type: ignore[list-item,arg-type]
            max_output_tokens=40, instructions="Use the calculator.", extra_body={"seed": 1},
        )  # fmt: skip
        calls = [o for o in first.output if o.type == "function_call"]
        follow_up: list[Any] = [
            question,
            *[o.model_dump(exclude_none=True) for o in first.output],
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "5"},
        ]
        final = await client.responses.create(
            model=model.name, input=follow_up, tools=RESPONSES_TOOLS, tool_choice="none",  # type: ignore[arg-type]
            max_output_tokens=8, extra_body={"seed": 1},
        )  # fmt: skip
    assert len(traj.calls) == 2
    for call, r in zip(traj.calls, [first, final], strict=True):
        extra = r.model_extra or {}
        assert call.prompt_token_ids == extra["prompt_token_ids"]
        assert call.completion_token_ids == extra["token_ids"]
        assert call.logprobs == extra["token_logprobs"]
        assert call.trainable and call.model == "plain@0" and call.raw_response["id"] == r.id  # type: ignore[index]
        assert call.usage and call.usage["completion_tokens"] == len(extra["token_ids"])
    # recorded as the chat completions they amount to
    assert traj.calls[0].messages == [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    assert traj.calls[0].tools == TOOLS and traj.calls[0].finish_reason == "tool_calls"
    assert [tc["id"] for tc in traj.calls[0].response_message["tool_calls"]] == [
        c.call_id for c in calls
    ]
    assert traj.calls[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": calls[0].call_id,
        "content": "5",
    }
    assert traj.calls[1].response_message["content"] == final.output_text
    (event,) = traj.tool_events
    assert (event.name, event.tool_call_id, event.result) == ("calculator", calls[0].call_id, "5")


async def test_a_streamed_response_is_recorded_whole(model: art.TrainableModel) -> None:
    client = model.openai_client()
    with art.capture() as traj:
        stream = await client.responses.create(
            model=model.name, input="hello", max_output_tokens=12, stream=True
        )
        events = [e async for e in stream]
    (call,) = traj.calls
    final = events[-1].response  # type: ignore[union-attr]
    extra = final.model_extra or {}
    assert call.completion_token_ids == extra["token_ids"] and len(extra["token_ids"]) > 0
    assert call.prompt_token_ids == extra["prompt_token_ids"]
    assert call.logprobs == extra["token_logprobs"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert call.response_message["content"] == text == final.output_text


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_openai_agents_sdk_agent_is_captured(
    model: art.TrainableModel, streamed: bool
) -> None:
    agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents)")
    from agents.models.openai_provider import OpenAIProvider

    @agents.function_tool
    def calculator() -> str:
        """The answer to the user's sum."""
        return "5"

    agent = agents.Agent(
        name="calc",
        instructions="Use the calculator.",
        model=model.name,
        tools=[calculator],
        # forced once (the SDK resets tool_choice after a tool ran), then the model answers
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=40),
    )
    # The provider's default model API is Responses; no tracing export (no OpenAI key).
    run_config = agents.RunConfig(
        model_provider=OpenAIProvider(openai_client=model.openai_client()), tracing_disabled=True
    )
    with art.capture() as traj:
        # The untrained model may keep calling the tool, or ramble past max_tokens (a
        # `response.incomplete`, which the SDK raises as ModelBehaviorError): every call
        # it made is recorded all the same.
        try:
            if streamed:
                run = agents.Runner.run_streamed(
                    agent, "What is 2 + 3?", run_config=run_config, max_turns=3
                )
                async for _ in run.stream_events():
                    pass
            else:
                await agents.Runner.run(agent, "What is 2 + 3?", run_config=run_config, max_turns=3)
        except agents.MaxTurnsExceeded:
            pass
        except agents.ModelBehaviorError as exc:
            assert "max_output_tokens" in str(exc)
    assert len(traj.calls) >= 2 and traj.exception is None
    assert all(c.raw_response and c.raw_response["object"] == "response" for c in traj.calls)
    for call in traj.calls:
        assert call.trainable and call.prompt_token_ids and call.completion_token_ids
        assert call.logprobs is not None and len(call.logprobs) == len(call.completion_token_ids)
    first = traj.calls[0].response_message["tool_calls"]
    assert first and first[0]["function"]["name"] == "calculator"
    assert traj.calls[0].messages[0] == {"role": "system", "content": "Use the calculator."}
    assert traj.calls[1].messages[-1]["role"] == "tool"
    assert traj.tool_events and traj.tool_events[0].name == "calculator"
    assert traj.tool_events[0].result == "5" and traj.tool_events[0].tool_call_id == first[0]["id"]


async def test_streamed_calls_are_recorded_whole(model: art.TrainableModel) -> None:
    client = model.openai_client()
    with art.capture() as traj:
        stream = await client.chat.completions.create(
            model=model.name,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=12,
            stream=True,
            seed=3,
        )
        text, ids = "", []
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                ids += (chunk.choices[0].model_extra or {}).get("token_ids") or []
    (call,) = traj.calls
    assert call.completion_token_ids == ids and len(ids) > 0
    assert call.response_message["content"] == text
    assert call.prompt_token_ids and call.logprobs is not None and len(call.logprobs) == len(ids)


async def test_outside_capture_requests_pass_untouched_and_nothing_is_recorded(
    model: art.TrainableModel,
) -> None:
    client = model.openai_client()
    r = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert r.choices[0].message.role == "assistant" and art.current_trajectory() is None
    assert r.choices[0].logprobs is None  # outside capture the request goes out untouched
    assert "prompt_token_ids" not in (r.model_extra or {})
    # a caller's explicit choice is kept: logprobs off stays off
    r = await client.chat.completions.create(
        model=model.name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        logprobs=False,
    )
    assert r.choices[0].logprobs is None


async def test_captured_openai_rollouts_train(model: art.TrainableModel) -> None:
    trajs = [(await _tool_loop(model, seed=s))[0] for s in range(4)]
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)
    result = await model.train([art.TrajectoryGroup(trajs)], art.TrainConfig(learning_rate=1e-3))
    assert result.step == 1
    # token-exact: the trainer used the recorded ids of every call, none re-tokenized
    assert result.metrics["tensorize/retokenized_calls"] == 0
    assert result.metrics["tensorize/sequences"] >= 4 and result.metrics["grad_norm"] > 0


def test_merge_stream_chunks_adds_up_tool_call_deltas() -> None:
    chunks = [
        {"id": "c", "model": "m@1", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "add", "arguments": '{"a"'}}]}, "token_ids": [5]}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "token_ids": [6], "finish_reason": "tool_calls"}]},
    ]  # fmt: skip
    merged = merge_stream_chunks(chunks)
    (choice,) = merged["choices"]
    assert merged["prompt_token_ids"] == [1, 2] and choice["token_ids"] == [5, 6]
    assert choice["message"]["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    ]
    assert choice["finish_reason"] == "tool_calls"


async def test_a_run_that_never_ended_does_not_take_a_plain_clients_calls(
    model: art.TrainableModel,
) -> None:
    """A trainable chat-model run names itself as the wire sink when it starts; one that
    never ends (cancelled mid-request) leaves it set. A plain client's call, which carries
    no chat-model header, still goes straight into the open capture."""
    import uuid

    from art_langgraph.tracing.callback import ART_METADATA_KEY, wire_sink
    from art_langgraph.tracing.capture import current_handler

    client = model.openai_client()
    with art.capture() as traj:
        handler = current_handler()
        assert handler is not None
        handler.on_chat_model_start(
            {}, [[]], run_id=uuid.uuid4(), metadata={ART_METADATA_KEY: True}
        )
        assert wire_sink() is not None  # left behind, as by a run that never ended
        await client.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=4  # type: ignore[list-item]
        )  # fmt: skip
    (call,) = traj.calls
    assert call.trainable and call.completion_token_ids
