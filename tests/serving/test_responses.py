"""The Responses API (`POST /v1/responses`) on the real server, driven by the real `openai`
client: plain and streamed, a function-call round trip, token ids, refusals; and the
OpenAI-shaped 404 for endpoints not served."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from art_langgraph.runtime.http_pool import async_http_client
from art_langgraph.serving import ServerHandle
from art_langgraph.serving.responses_protocol import chat_messages
from tests.serving.test_server import WEATHER as CHAT_WEATHER

WEATHER = {"type": "function", **CHAT_WEATHER["function"]}  # Responses' flat form
IDS = {"return_token_ids": True, "return_token_logprobs": True}


@pytest.fixture
def client(server: ServerHandle) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=server.base_url, api_key="unused", max_retries=0, http_client=async_http_client()
    )


async def test_a_plain_response_is_the_chat_completion_of_the_same_messages(
    client: AsyncOpenAI,
) -> None:
    r = await client.responses.create(
        model="tiny",
        instructions="Answer briefly.",
        input="What is the weather in Paris?",
        max_output_tokens=12,
        extra_body={"seed": 1, **IDS},  # `seed` is ours (and vLLM's), not in the client's signature
    )
    extra = r.model_extra or {}
    assert r.object == "response" and r.model == "tiny@0" and r.id.startswith("resp_")
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text" and r.output_text == item.content[0].text
    assert r.usage is not None and r.usage.output_tokens == len(extra["token_ids"])
    assert r.usage.input_tokens == len(extra["prompt_token_ids"])
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert len(extra["token_logprobs"]) == len(extra["token_ids"])
    assert r.status in ("completed", "incomplete")
    if r.status == "incomplete":
        assert r.incomplete_details and r.incomplete_details.reason == "max_output_tokens"
    # The same engine path: the chat completion of the translated messages is identical.
    c = await client.chat.completions.create(
        model="tiny",
        messages=[  # type: ignore[list-item]
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        max_completion_tokens=12,
        seed=1,
        extra_body=IDS,
    )
    assert (c.model_extra or {})["prompt_token_ids"] == extra["prompt_token_ids"]
    assert (c.choices[0].model_extra or {})["token_ids"] == extra["token_ids"]
    assert c.choices[0].message.content == r.output_text
    # without return_token_ids none of the extras is there
    plain = await client.responses.create(model="tiny", input="hi", max_output_tokens=4)
    assert not {"prompt_token_ids", "token_ids", "token_logprobs"} & set(plain.model_extra or {})


async def test_input_items_with_text_parts_and_logprobs(client: AsyncOpenAI) -> None:
    r = await client.responses.create(
        model="tiny",
        input=[
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
            {"role": "user", "content": "Weather?"},
        ],
        max_output_tokens=6,
        temperature=0,
        top_p=0.9,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    part = r.output[0].content[0]  # type: ignore[union-attr]
    assert len(part.logprobs or []) == len((r.model_extra or {})["token_ids"])
    assert all(len(lp.top_logprobs or []) == 2 for lp in part.logprobs or [])
    assert r.temperature == 0 and r.top_p == 0.9


async def test_streaming_sends_openais_events_and_the_same_response(client: AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "input": "Tell me about Paris.",
        "max_output_tokens": 16,
        "extra_body": {"seed": 5, **IDS},
    }
    plain = await client.responses.create(**kwargs)
    stream = await client.responses.create(stream=True, **kwargs)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if plain.status == "completed" else "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert text == final.output_text == plain.output_text
    assert (final.model_extra or {})["token_ids"] == (plain.model_extra or {})["token_ids"]
    assert (final.model_extra or {})["prompt_token_ids"] == (plain.model_extra or {})[
        "prompt_token_ids"
    ]
    counts = ("input_tokens", "output_tokens", "total_tokens")  # cached_tokens may differ
    assert final.usage and plain.usage
    assert [getattr(final.usage, k) for k in counts] == [getattr(plain.usage, k) for k in counts]


async def test_a_function_call_round_trip(client: AsyncOpenAI) -> None:
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = await client.responses.create(
        model="tiny",
        input=[question],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=60,
        extra_body={"seed": 2},
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    call = calls[0]
    assert call.status == "completed" and call.id and call.id.startswith("fc_")
    assert set(json.loads(call.arguments)) == {"city"}
    assert first.tools[0].name == "get_weather"  # type: ignore[union-attr]
    follow_up: list[Any] = [
        question,
        *[o.model_dump(exclude_none=True) for o in first.output],
        *[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls],
    ]
    final = await client.responses.create(
        model="tiny",
        input=follow_up,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=8,
        extra_body={"seed": 2, **IDS},
    )
    assert [o.type for o in final.output] == ["message"]
    # The prompt is the chat rendering of the same conversation, tool result included.
    messages = chat_messages(None, follow_up)
    assert [tc["id"] for tc in messages[1]["tool_calls"]] == [c.call_id for c in calls]
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": c.call_id, "content": "sunny"} for c in calls
    ]
    chat = await client.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],  # type: ignore[list-item]
        tool_choice="none",
        max_completion_tokens=8,
        seed=2,
        extra_body=IDS,
    )  # fmt: skip
    assert (chat.model_extra or {})["prompt_token_ids"] == (final.model_extra or {})[
        "prompt_token_ids"
    ]
    # a named tool_choice forces that tool
    named = await client.responses.create(
        model="tiny",
        input="weather?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
    )
    assert [o.type for o in named.output] == ["function_call"]


async def test_streamed_function_calls(client: AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model="tiny",
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=60,
        extra_body={"seed": 3},
        stream=True,
    )
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    items = [
        e.item
        for e in events
        if e.type == "response.output_item.done" and e.item.type == "function_call"
    ]
    assert done and len(done) == len(items)
    assert [d.arguments for d in done] == [i.arguments for i in items]  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert kinds[-1] == "response.completed"
    assert [o.model_dump() for o in final.output] == [i.model_dump() for i in items]


async def _post(server: ServerHandle, path: str, body: Any, method: str = "POST") -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url.removesuffix("/v1")) as http:
        return await http.request(method, path, json=body)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content",
        ),
    ],
)
async def test_unsupported_features_are_refused_with_a_400(
    server: ServerHandle, extra: dict[str, Any], param: str
) -> None:
    r = await _post(server, "/v1/responses", {"model": "tiny", "input": "hi", **extra})
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == "unsupported_parameter"
    assert error["type"] == "invalid_request_error" and "not supported" in error["message"]


async def test_refusals_reach_the_openai_client_and_store_false_is_fine(
    client: AsyncOpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        await client.responses.create(model="tiny", input="hi", previous_response_id="resp_x")
    r = await client.responses.create(model="tiny", input="hi", store=False, max_output_tokens=2)
    assert r.store is False
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        await client.responses.create(model="tiny", input="hi", max_output_tokens=0)
    with pytest.raises(openai.NotFoundError, match="nope"):
        await client.responses.create(model="nope", input="hi")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v1/completions", 404),
        ("POST", "/v1/embeddings", 404),
        ("GET", "/v1/responses/resp_123", 404),
        ("GET", "/nowhere", 404),
        ("GET", "/v1/chat/completions", 405),
    ],
)
async def test_endpoints_not_served_answer_in_openais_error_shape(
    server: ServerHandle, method: str, path: str, status: int
) -> None:
    r = await _post(server, path, {"model": "tiny"} if method == "POST" else None, method)
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert f"{method} {path}" in error["message"]
    for served in ("POST /v1/chat/completions", "POST /v1/responses", "GET /v1/models"):
        assert served in error["message"]
