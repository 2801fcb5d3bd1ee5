"""`ChatService` without HTTP: request bytes -> plan -> engine -> typed response."""

from __future__ import annotations

import json

import pytest

from art_langgraph.engine.torch_engine import TorchEngine
from art_langgraph.serving.chat_protocol import ChatCompletion
from art_langgraph.serving.chat_service import ChatService, ServiceError
from art_langgraph.serving.config import ServerConfig
from art_langgraph.serving.registry import ModelRegistry


@pytest.fixture
def service(engine: TorchEngine, registry: ModelRegistry) -> ChatService:
    return ChatService(engine, registry, ServerConfig())


def _body(**fields: object) -> bytes:
    return json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
    ).encode()


async def test_a_request_becomes_a_typed_response(service: ChatService) -> None:
    plan = service.plan(
        service.parse(_body(max_tokens=5, n=2, seed=7, logprobs=True, return_token_ids=True))
    )
    assert len(plan.samplings) == 2 and plan.samplings[1].seed == 8
    results = await service.generate(plan)
    response = service.response(plan, results)
    assert isinstance(response, ChatCompletion) and response.model == "tiny@0"
    data = json.loads(response.model_dump_json())
    assert data["prompt_token_ids"] == plan.prompt_ids
    for choice, result in zip(data["choices"], results, strict=True):
        assert choice["token_ids"] == result.completion_token_ids
        assert [t["logprob"] for t in choice["logprobs"]["content"]] == result.logprobs
    assert data["usage"]["completion_tokens"] == sum(len(r.completion_token_ids) for r in results)
    # without return_token_ids the extras are absent, OpenAI's own fields present
    plain = service.response(service.plan(service.parse(_body(max_tokens=2))), results[:1])
    out = json.loads(plain.model_dump_json())
    assert "prompt_token_ids" not in out and "token_ids" not in out["choices"][0]
    assert out["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"[1]", 400, "must be a JSON object"),
        (_body(model="nope"), 404, "not served here"),
        (_body(max_tokens=10**6), 400, "context"),
        (_body(n=64, max_tokens=1000), 400, "n x max_tokens"),
        (_body(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}}), 400, "not among the tools"),
    ],
)  # fmt: skip
def test_bad_requests_are_service_errors(
    service: ChatService, body: bytes, status: int, message: str
) -> None:
    with pytest.raises(ServiceError) as err:
        service.plan(service.parse(body))
    assert err.value.status == status and message in err.value.message
    assert err.value.body()["error"]["message"] == err.value.message


async def test_stream_events_add_up_to_the_completion(service: ChatService) -> None:
    plan = service.plan(
        service.parse(_body(max_tokens=6, stream=True, return_token_ids=True, seed=1))
    )
    events = [e async for e in service.stream(plan)]
    assert events[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert chunks[0]["prompt_token_ids"] == plan.prompt_ids
    ids = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
    assert len(ids) == 6 and chunks[-1]["choices"][0]["finish_reason"] == "length"
