"""The Guard on its own: an exception that escapes the app becomes a JSON 500, and the
connection is not dropped (uvicorn closes it only when an exception reaches it)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from art_langgraph.serving.guard import Guard


def _scope(headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }


async def _call(app: Any, headers: dict[str, str], body: bytes = b"{}") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await Guard(app, api_key=None, max_body_bytes=1024)(_scope(headers), receive, send)
    return sent


JSON_LOCAL = {"host": "127.0.0.1:9", "content-type": "application/json"}


async def test_an_escaping_exception_becomes_a_json_500_and_is_not_reraised() -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        raise RuntimeError("a bug")

    sent = await _call(broken, JSON_LOCAL)  # returns: nothing reaches uvicorn
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"])["error"]["type"] == "server_error"


async def test_an_exception_after_the_response_started_is_reraised() -> None:
    async def half(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("mid-stream")

    with pytest.raises(RuntimeError, match="mid-stream"):
        await _call(half, JSON_LOCAL)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"host": "evil.example", "content-type": "application/json"}, 421),
        ({"host": "[::1]:8000", "content-type": "text/plain"}, 415),
        ({"host": "localhost", "content-type": "application/json", "content-length": "2048"}, 413),
    ],
)
async def test_checks_answer_before_the_app_runs(headers: dict[str, str], status: int) -> None:
    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app must not run")

    sent = await _call(never, headers)
    assert sent[0]["status"] == status and "error" in json.loads(sent[1]["body"])


async def test_a_body_that_grows_past_the_limit_gets_413() -> None:
    async def reads(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        raise AssertionError("unreachable: the body was too large")

    sent = await _call(reads, JSON_LOCAL, body=b"x" * 4096)
    assert sent[0]["status"] == 413
