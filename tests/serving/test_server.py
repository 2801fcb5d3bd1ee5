"""The real server on a free loopback port, driven by the real `openai` client."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from art_langgraph.engine import TorchEngine
from art_langgraph.errors import UsageError
from art_langgraph.runtime.http_pool import async_http_client
from art_langgraph.serving import ModelRegistry, ServerHandle, start_server
from tests.conftest import API_KEY

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 999},
                "b": {"type": "integer", "minimum": 0, "maximum": 999},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
def client(server: ServerHandle) -> AsyncOpenAI:
    return _openai(server.base_url, "unused")


def _openai(base_url: str, api_key: str) -> AsyncOpenAI:
    # Our http client: openai's default one closes itself from __del__ (see chat_model.py).
    return AsyncOpenAI(
        base_url=base_url, api_key=api_key, max_retries=0, http_client=async_http_client()
    )


async def test_plain_chat_with_token_ids_and_logprobs(
    client: AsyncOpenAI, engine: TorchEngine
) -> None:
    r = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=12,
        logprobs=True,
        top_logprobs=3,
        seed=1,
        extra_body={"return_token_ids": True},
    )
    assert r.model == "tiny@0"
    choice = r.choices[0]
    prompt_ids = r.model_extra["prompt_token_ids"]  # type: ignore[index]
    token_ids = choice.model_extra["token_ids"]  # type: ignore[index]
    rendered = engine.tokenizer.apply_chat_template(
        USER, add_generation_prompt=True, tokenize=False
    )
    assert prompt_ids == engine.tokenizer.encode(rendered, add_special_tokens=False)
    assert r.usage is not None and r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(token_ids) <= 12
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert len(choice.logprobs.content) == len(token_ids)
    assert all(len(x.top_logprobs) == 3 for x in choice.logprobs.content)
    assert all(x.top_logprobs[0].logprob >= x.logprob - 1e-6 for x in choice.logprobs.content)
    text = engine.tokenizer.decode(token_ids, skip_special_tokens=True)
    assert choice.message.content == text
    assert choice.finish_reason in ("stop", "length")


async def test_token_logprobs_are_the_logprobs_as_plain_floats(client: AsyncOpenAI) -> None:
    kw: dict[str, Any] = {"model": "tiny", "messages": USER, "max_tokens": 12, "seed": 5}
    both = await client.chat.completions.create(
        **kw, logprobs=True, extra_body={"return_token_ids": True, "return_token_logprobs": True}
    )
    choice = both.choices[0]
    floats = choice.model_extra["token_logprobs"]  # type: ignore[index]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert floats == [x.logprob for x in choice.logprobs.content]
    assert len(floats) == len(choice.model_extra["token_ids"])  # type: ignore[index]
    # Alone, without OpenAI's per-token objects; and split across stream chunks.
    plain = await client.chat.completions.create(**kw, extra_body={"return_token_logprobs": True})
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].model_extra["token_logprobs"] == floats  # type: ignore[index]
    stream = await client.chat.completions.create(
        **kw, stream=True, extra_body={"return_token_ids": True, "return_token_logprobs": True}
    )
    ids: list[int] = []
    streamed: list[float] = []
    async for chunk in stream:
        for c in chunk.choices:
            extra = c.model_extra or {}
            ids += extra.get("token_ids") or []
            streamed += extra.get("token_logprobs") or []
            assert len(extra.get("token_ids") or []) == len(extra.get("token_logprobs") or [])
    assert streamed == floats and len(ids) == len(floats)
    # Not asked for: not sent.
    neither = await client.chat.completions.create(**kw)
    assert "token_logprobs" not in (neither.choices[0].model_extra or {})


async def test_seeded_requests_repeat_and_n_gives_distinct_choices(client: AsyncOpenAI) -> None:
    kw = {"model": "tiny", "messages": USER, "max_tokens": 16, "seed": 42}
    a, b = await asyncio.gather(
        client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    )
    assert a.choices[0].message.content == b.choices[0].message.content
    many = await client.chat.completions.create(**kw, n=4)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].message.content == a.choices[0].message.content  # choice i uses seed + i
    assert len({c.message.content for c in many.choices}) > 1


async def test_required_tool_choice_returns_openai_tool_calls(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[WEATHER, ADD],
        tool_choice="required",
        max_tokens=80,
        seed=3,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert calls and all(c.function.name in ("get_weather", "add") for c in calls)
    for c in calls:
        args = json.loads(c.function.arguments)
        assert set(args) == ({"city"} if c.function.name == "get_weather" else {"a", "b"})


async def test_forced_call_is_what_the_template_renders(
    client: AsyncOpenAI, engine: TorchEngine
) -> None:
    """A forced call must look like the calls the model sees in its history (and was
    fine-tuned on): the same text, separators included. Compact JSON (`{"a":1}`) where the
    template renders `{"a": 1}` put every forced call off the model's distribution."""
    r = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[ADD],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        seed=5,
        extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    call = (choice.message.tool_calls or [])[0]
    generated = list(choice.model_extra["token_ids"])  # type: ignore[index]
    tok = engine.tokenizer
    history = [
        *USER,
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
    ]
    rendered = tok.apply_chat_template(history, tools=[ADD], tokenize=False)
    prompt = tok.apply_chat_template(USER, tools=[ADD], tokenize=False, add_generation_prompt=True)
    assert rendered.startswith(prompt)
    text = tok.decode(generated)
    assert rendered[len(prompt) :].startswith(text.removesuffix("<|im_end|>"))
    # The markup around the JSON is the template's own tokens (a random model may still
    # pick a non-canonical split of a number inside it).
    assert generated[:3] == tok.encode(rendered[len(prompt) :], add_special_tokens=False)[:3]
    assert ", " in call.function.arguments and ": " in call.function.arguments


async def test_named_tool_choice_and_a_multi_turn_tool_conversation(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=60,
        seed=4,
    )
    calls = r.choices[0].message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "add"
    convo = [
        *USER,
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "5"},
    ]
    r2 = await client.chat.completions.create(
        model="tiny", messages=convo, tools=[WEATHER, ADD], max_tokens=10
    )
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")


async def test_allowed_tools_restrict_the_call_but_not_the_prompt(
    client: AsyncOpenAI,
) -> None:
    """OpenAI's `allowed_tools` choice: every call names an allowed tool, and the prompt is
    the one every tool renders (the same prompt tokens as plain "required"), so an agent
    that forbids a tool for a turn keeps the prefix it has cached. "auto" mode and names
    outside `tools` get a 400."""

    def allowed(mode: str, *names: str) -> dict[str, Any]:
        tools = [{"type": "function", "function": {"name": n}} for n in names]
        return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}

    kw: dict[str, Any] = {"model": "tiny", "messages": USER, "tools": [WEATHER, ADD]}
    kw |= {"max_tokens": 60, "extra_body": {"return_token_ids": True}}
    prompts = set()
    for seed in range(2):
        for only in (None, "add", "get_weather"):  # the same seed: only the choice differs
            choice = allowed("required", only) if only else "required"
            r = await client.chat.completions.create(**kw, tool_choice=choice, seed=seed)  # type: ignore[arg-type]
            prompts.add(r.usage.prompt_tokens if r.usage else None)
            names = {c.function.name for c in r.choices[0].message.tool_calls or []}
            assert names and (only is None or names == {only}), (only, names)
    assert len(prompts) == 1
    for bad, match in ((allowed("auto", "add"), "mode"), (allowed("required", "zz"), "zz")):
        with pytest.raises(openai.BadRequestError, match=match):
            await client.chat.completions.create(**kw, tool_choice=bad)  # type: ignore[arg-type]


async def test_malformed_tool_call_comes_back_as_content(client: AsyncOpenAI) -> None:
    # Force the model to write a broken tool call; the server must hand it back as text.
    broken = (
        'start: <tool_call> "\\n{\\"name\\": \\"add\\", \\"arguments\\": {oops\\n" </tool_call>'
    )
    r = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[ADD],
        max_tokens=40,
        extra_body={"structured_outputs": {"grammar": broken}},
    )
    msg = r.choices[0].message
    assert msg.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert msg.content == '<tool_call>\n{"name": "add", "arguments": {oops\n</tool_call>'


async def test_json_schema_response_format(client: AsyncOpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "maxLength": 20},
            "confident": {"type": "boolean"},
        },
        "required": ["answer", "confident"],
        "additionalProperties": False,
    }
    r = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    obj = json.loads(r.choices[0].message.content or "")
    assert set(obj) == {"answer", "confident"} and isinstance(obj["confident"], bool)
    r = await client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=60, response_format={"type": "json_object"}, seed=2
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


async def test_stop_strings_cut_the_text(client: AsyncOpenAI) -> None:
    full = await client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=20, temperature=0
    )
    text = full.choices[0].message.content or ""
    stop = text[8:10]
    cut = await client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=20, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


async def test_streaming_matches_the_plain_response(client: AsyncOpenAI) -> None:
    kw = {"model": "tiny", "messages": USER, "max_tokens": 24, "seed": 9}
    plain = await client.chat.completions.create(**kw, extra_body={"return_token_ids": True})
    stream = await client.chat.completions.create(
        **kw,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    text, ids, finish, usage, models = "", [], None, None, set()
    async for chunk in stream:
        models.add(chunk.model)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            ids += (c.model_extra or {}).get("token_ids") or []
            finish = c.finish_reason or finish
    assert text == plain.choices[0].message.content
    assert ids == plain.choices[0].model_extra["token_ids"]  # type: ignore[index]
    assert finish == plain.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == len(ids)
    assert models == {"tiny@0"}


async def test_streaming_tool_calls(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[ADD],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        seed=5,
        stream=True,
    )
    calls, content, finish = [], "", None
    async for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and content == ""
    assert calls and calls[0].function is not None and calls[0].function.name == "add"
    assert set(json.loads(calls[0].function.arguments or "")) == {"a", "b"}


async def test_64_concurrent_requests_are_all_answered(client: AsyncOpenAI) -> None:
    async def one(i: int) -> str:
        r = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"request {i}"}],
            max_tokens=16,
            seed=i,
        )
        return r.choices[0].message.content or ""

    answers = await asyncio.gather(*(one(i) for i in range(64)))
    assert len(answers) == 64
    again = await one(7)
    assert again == answers[7]  # batching did not change a seeded answer


async def test_adapter_steps_route_by_name_and_pin(
    client: AsyncOpenAI, engine: TorchEngine, registry: ModelRegistry, lora_adapter: Path
) -> None:
    await engine.load_adapter("agent@1", str(lora_adapter))
    registry.add_model("agent")
    registry.set_step("agent", 1, "agent@1")
    kw = {"messages": USER, "max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}
    latest = await client.chat.completions.create(model="agent", **kw)
    pinned0 = await client.chat.completions.create(model="agent@0", **kw)
    base = await client.chat.completions.create(model="tiny", **kw)
    assert (latest.model, pinned0.model, base.model) == ("agent@1", "agent@0", "tiny@0")
    assert pinned0.choices[0].message.content == base.choices[0].message.content
    assert latest.choices[0].message.content != base.choices[0].message.content
    listed = {m.id for m in (await client.models.list()).data}
    assert {"tiny", "agent", "agent@0", "agent@1"} <= listed
    with pytest.raises(openai.NotFoundError, match="agent@7"):
        await client.chat.completions.create(model="agent@7", **kw)
    registry.drop_step("agent", 1)
    await engine.unload_adapter("agent@1")
    after = await client.chat.completions.create(model="agent", **kw)
    assert after.model == "agent@0"


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "nope", "messages": USER}, 404, "nope"),
        ({"model": "tiny", "messages": []}, 400, "messages"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
        ({"model": "tiny", "messages": USER, "temperature": 7}, 400, "temperature"),
        ({"model": "tiny", "messages": USER, "n": 0}, 400, "n"),
        ({"model": "tiny", "messages": USER, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"model": "tiny", "messages": USER, "tools": [{"type": "function"}]}, 400, "tools[0]"),
        (
            {
                "model": "tiny",
                "messages": USER,
                "tools": [ADD],
                "tool_choice": {"type": "function", "function": {"name": "zz"}},
            },
            400,
            "zz",
        ),
        (
            {"model": "tiny", "messages": USER, "response_format": {"type": "xml"}},
            400,
            "response_format",
        ),
        (
            {
                "model": "tiny",
                "messages": USER,
                "response_format": {"type": "json_object"},
                "tools": [ADD],
                "tool_choice": "required",
            },
            400,
            "one constraint",
        ),
        (
            {"model": "tiny", "messages": USER, "max_tokens": 100000},
            400,
            "maximum context length is 4096",
        ),
        ({"messages": USER}, 400, "model"),
    ],
)
async def test_bad_requests_get_openai_errors(
    server: ServerHandle, body: dict, status: int, needle: str
) -> None:
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{server.base_url}/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] in ("invalid_request_error",)


async def test_prompt_longer_than_the_context_names_both_lengths(client: AsyncOpenAI) -> None:
    long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="tiny", messages=long, max_tokens=5)
    msg = str(info.value)
    assert "maximum context length is 4096 tokens" in msg
    assert re.search(r"the prompt has \d{5} tokens", msg)


async def test_malformed_json_body(server: ServerHandle) -> None:
    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{server.base_url}/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = await http.post(f"{server.base_url}/chat/completions", json=[1, 2])
        assert r.status_code == 400
        health = await http.get(server.base_url.removesuffix("/v1") + "/health")
        assert health.json()["status"] == "ok"


async def test_api_key_is_enforced(keyed_server: ServerHandle) -> None:
    bad = _openai(keyed_server.base_url, "wrong")
    with pytest.raises(openai.AuthenticationError):
        await bad.chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        await bad.models.list()
    good = _openai(keyed_server.base_url, API_KEY)
    r = await good.chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    assert r.choices[0].message is not None


def test_non_loopback_bind_needs_an_api_key(engine: TorchEngine) -> None:
    with pytest.raises(UsageError, match="without an API key"):
        start_server(engine, ModelRegistry("tiny"), host="0.0.0.0")
    with pytest.raises(UsageError, match="without an API key"):
        start_server(engine, ModelRegistry("tiny"), host="192.168.1.20")


async def test_a_served_call_records_token_exactly(client: AsyncOpenAI, tmp_path: Path) -> None:
    from art_langgraph import LLMCall, Trajectory, read_jsonl, write_jsonl

    kwargs = {
        "model": "tiny",
        "messages": USER,
        "tools": [ADD],
        "tool_choice": "required",
        "max_tokens": 40,
        "seed": 8,
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }
    r = await client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    call = LLMCall.from_openai(kwargs, r)
    assert call.prompt_token_ids == r.model_extra["prompt_token_ids"]  # type: ignore[index]
    assert call.completion_token_ids == r.choices[0].model_extra["token_ids"]  # type: ignore[index]
    assert call.logprobs is not None and len(call.logprobs) == len(call.completion_token_ids or [])
    assert (call.model, call.adapter_step, call.finish_reason) == ("tiny@0", 0, "tool_calls")
    traj = Trajectory(messages=call.to_messages(), calls=[call], reward=1.0)
    write_jsonl(tmp_path / "t.jsonl", [traj])
    (back,) = read_jsonl(tmp_path / "t.jsonl")
    assert back.model_dump(mode="json") == traj.model_dump(mode="json")
