"""Capture for plain OpenAI clients: `model.openai_client()` records its chat completions.

The client returned by `model.openai_client()` sends its requests through
`CapturingTransport`, an httpx transport in front of the shared per-loop pools. When a
`capture()` block is open in the caller's context, a `POST .../chat/completions` asks the
server for token ids and their logprobs (adding `return_token_ids` and
`return_token_logprobs`, plain lists beside the choice, unless the caller set them; the
caller's own `logprobs` choice is left as it was) and is recorded as an `LLMCall` with
the exact prompt and completion token ids the server returned, the way the LangChain
path does.
Streamed responses pass through untouched chunk by chunk and are recorded once the
stream ends. Everything else, and every request outside `capture()`, passes through untouched (its
body is not even parsed); a failure to record is logged on the
trajectory, never raised into the caller's code.

Why the transport and not a patched `openai` module: it works for any code holding the
client (the OpenAI Agents SDK, hand-written loops), changes nothing process-wide, and
sees the exact bytes the server sent. Left out: the legacy `/completions` and the
Responses API (our server serves chat completions).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx

from art_langgraph.capture import TrajectoryCallback, current_handler
from art_langgraph.trajectory import LLMCall

__all__ = ["CapturingTransport", "merge_stream_chunks"]

log = logging.getLogger(__name__)


class CapturingTransport(httpx.AsyncBaseTransport):
    """Records chat completions into the open `capture()` (see the module doc)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        handler = current_handler()
        if (
            handler is None
            or request.method != "POST"
            or not request.url.path.endswith("/chat/completions")
        ):
            return await self.inner.handle_async_request(request)
        try:
            body = json.loads(request.content)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return await self.inner.handle_async_request(request)
        if "return_token_ids" not in body or "return_token_logprobs" not in body:
            body.setdefault("return_token_ids", True)
            body.setdefault("return_token_logprobs", True)
            headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
            request = httpx.Request(
                request.method,
                request.url,
                headers=headers,
                content=json.dumps(body).encode(),
                extensions=request.extensions,
            )
        started_at, t0 = datetime.now(UTC), time.perf_counter()
        response = await self.inner.handle_async_request(request)
        if response.status_code != 200:
            return response
        if body.get("stream"):
            stream = _RecordingStream(response, handler, body, started_at, t0)
            return httpx.Response(
                response.status_code,
                headers=response.headers,
                stream=stream,
                extensions=response.extensions,
                request=request,
            )
        raw = await response.aread()
        await response.aclose()
        _record(handler, body, raw, started_at, t0)
        headers = [
            (k, v)
            for k, v in response.headers.raw
            if k.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")
        ]
        return httpx.Response(
            response.status_code,
            headers=headers,
            content=raw,
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def _record(
    handler: TrajectoryCallback,
    body: dict[str, Any],
    completion: bytes | dict[str, Any],
    started_at: datetime,
    t0: float,
) -> None:
    try:
        data = json.loads(completion) if isinstance(completion, bytes) else completion
        n = len(data.get("choices") or [])
        for i in range(n):
            call = LLMCall.from_openai(
                body,
                data,
                choice_index=i,
                latency_s=time.perf_counter() - t0,
                started_at=started_at,
            )
            call.trainable = call.completion_token_ids is not None
            handler.record_call(call)
    except Exception as exc:  # recording must never break the caller's code
        log.warning("capture: recording an OpenAI call failed: %r", exc)
        handler.trajectory.logs.append(f"capture: recording an OpenAI call failed: {exc!r}")


class _RecordingStream(httpx.AsyncByteStream):
    """Passes the SSE bytes through and records the merged completion at the end."""

    def __init__(
        self,
        response: httpx.Response,
        handler: TrajectoryCallback,
        body: dict[str, Any],
        started_at: datetime,
        t0: float,
    ) -> None:
        self.response, self.handler, self.body = response, handler, body
        self.started_at, self.t0 = started_at, t0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # Each part is read before it is handed on: a client stops at `[DONE]` and closes the
        # stream without asking for more, so the call is recorded when `[DONE]` arrives.
        buffer, chunks, done = b"", [], False
        async for part in self.response.aiter_raw():
            buffer += part
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                for line in event.splitlines():
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    with contextlib.suppress(ValueError):  # not ours to judge
                        chunks.append(json.loads(data))
            if done and chunks and not any("error" in c for c in chunks):
                _record(
                    self.handler, self.body, merge_stream_chunks(chunks), self.started_at, self.t0
                )
                chunks = []
            yield part

    async def aclose(self) -> None:
        await self.response.aclose()


def merge_stream_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Chat-completion chunks -> the ChatCompletion they add up to (content, tool calls,
    token ids and their logprobs, logprobs, finish reason, usage), per choice index."""
    first = chunks[0]
    out: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion",
        "created": first.get("created"),
        "model": first.get("model"),
    }
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if "prompt_token_ids" in chunk:
            out["prompt_token_ids"] = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for c in chunk.get("choices") or []:
            i = int(c.get("index", 0))
            ch = choices.setdefault(
                i,
                {
                    "index": i,
                    "message": {"role": "assistant", "content": ""},
                    "finish_reason": None,
                    "logprobs": None,
                },
            )
            delta = c.get("delta") or {}
            if delta.get("content"):
                ch["message"]["content"] += delta["content"]
            for tc in delta.get("tool_calls") or []:
                calls = ch["message"].setdefault("tool_calls", [])
                k = int(tc.get("index", len(calls)))
                while len(calls) <= k:
                    calls.append(
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                fn = tc.get("function") or {}
                calls[k]["id"] = tc.get("id") or calls[k]["id"]
                calls[k]["function"]["name"] += fn.get("name") or ""
                calls[k]["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("token_ids"):
                ch.setdefault("token_ids", []).extend(c["token_ids"])
            if c.get("token_logprobs"):
                ch.setdefault("token_logprobs", []).extend(c["token_logprobs"])
            if (lp := c.get("logprobs")) and lp.get("content"):
                ch["logprobs"] = ch["logprobs"] or {"content": []}
                ch["logprobs"]["content"].extend(lp["content"])
            if c.get("finish_reason"):
                ch["finish_reason"] = c["finish_reason"]
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out
