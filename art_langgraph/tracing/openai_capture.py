"""The capturing transport: every chat completion and Responses call that
`model.openai_client()` or `model.chat_model()` sends inside `art.capture()` is recorded
from the request and the response as they were sent.

Both clients send their requests through `CapturingTransport` (`CapturingSyncTransport`
for a chat model's sync calls), an httpx transport in front of the shared per-loop pools
or a caller's own client (`ClientTransport`). When a `capture()` block is open in the
caller's context, or a `TrainableChatModel`'s LangChain run is under way (its capture
handler names the run, `capture.wire_sink`), a `POST .../chat/completions` or `POST .../responses` asks the server
for token ids and their logprobs (adding `return_token_ids` and `return_token_logprobs`,
plain lists beside the choice or, for a response, at its top level, unless the caller set
them; the caller's own `logprobs` or `include` choice is left as it was) and is recorded
as an `LLMCall` with the exact prompt and completion token ids the server returned: into
the open capture for a plain client, or handed to the LangChain run's capture handler,
which adds the graph position (`capture.py`).

A Responses call is recorded as the chat completion it amounts to (`messages` from its
`instructions` and `input` items, chat-form `tools`, a `response_message` whose
`tool_calls` carry the function calls' `call_id`s; `raw_response` is the response as
sent), so the trainer and the review page read both alike.
Streamed responses pass through untouched chunk by chunk (event by event) and are
recorded once the stream ends (`[DONE]`; a Responses stream's `response.completed` or
`response.incomplete`, which carries the whole response).

Tool events: a plain client's request (a LangChain run's tools report their own) that sends back a tool's result (a `tool` message, a
`function_call_output` item) for a tool call that a call recorded in this trajectory
made adds a `ToolEvent` (the call's name and arguments, the result as sent), once per
tool call id. Its latency and start are unknown here (the tool ran in the caller's
code) and left None, and a result is never marked as an error (the transport cannot
tell a tool's error message from its output).

Everything else, and every request outside `capture()`, passes through untouched (its
body is not even parsed); a failure to record is logged on the trajectory, never raised
into the caller's code.

Why the transport and not a patched `openai` module: it works for any code holding the
client (the OpenAI Agents SDK, hand-written loops), changes nothing process-wide, and
sees the exact bytes the server sent. Left out: the legacy `/completions`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any, Literal

import httpx

from art_langgraph.runtime.http_pool import with_json_body
from art_langgraph.serving.responses_protocol import (
    as_chat_completion,
    chat_messages,
    chat_tool_choice,
    chat_tools,
)
from art_langgraph.tracing.callback import (
    CHAT_MODEL_HEADER,
    TrajectoryCallback,
    WireSink,
    wire_sink,
)
from art_langgraph.tracing.capture import current_handler
from art_langgraph.trajectories.trajectory import LLMCall, ToolEvent

log = logging.getLogger(__name__)

_Api = Literal["chat", "responses"]
_RESPONSE_DONE = ("response.completed", "response.incomplete")


class _Exchange:
    """One recorded POST: its body (asking for token ids), where its calls go, and when it
    started. `of` returns None for what passes through untouched."""

    def __init__(
        self,
        request: httpx.Request,
        body: dict[str, Any],
        api: _Api,
        sink: WireSink | None,
        handler: TrajectoryCallback | None,
    ) -> None:
        self.request, self.body, self.api = request, body, api
        self.sink, self.handler = sink, handler
        self.started_at, self.t0 = datetime.now(UTC), time.perf_counter()

    @classmethod
    def of(cls, request: httpx.Request) -> _Exchange | None:
        # A chat model's request reaches the capture only through its run (the run's handler
        # records it once, with its graph position); a plain client's, only directly (a sink
        # left behind by a run that never ended must not take its calls).
        if request.headers.get(CHAT_MODEL_HEADER):
            sink, handler = wire_sink(), None
        else:
            sink, handler = None, current_handler()
        if (sink is None and handler is None) or request.method != "POST":
            return None
        path = request.url.path
        if path.endswith("/chat/completions"):
            api: _Api = "chat"
        elif path.endswith("/responses"):
            api = "responses"
        else:
            return None
        try:
            body = json.loads(request.content)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return None
        if sink is None and handler is not None:  # a LangChain run records its own tools
            _record_tool_results(handler, body, api)
        if "return_token_ids" not in body or "return_token_logprobs" not in body:
            body.setdefault("return_token_ids", True)
            body.setdefault("return_token_logprobs", True)
            request = with_json_body(request, body)
        return cls(request, body, api, sink, handler)

    def record(self, completion: bytes | dict[str, Any]) -> None:
        """Build the calls of one response (one per choice) and deliver them."""
        try:
            data = json.loads(completion) if isinstance(completion, bytes) else completion
            raw, body = data, _without_echoed_ids(self.body)
            if self.api == "responses":  # recorded as the chat completion it amounts to
                body, data = responses_as_chat(body), as_chat_completion(data)
            calls = []
            for i in range(len(data.get("choices") or [])):
                call = LLMCall.from_openai(
                    body,
                    data,
                    choice_index=i,
                    latency_s=time.perf_counter() - self.t0,
                    started_at=self.started_at,
                )
                call.raw_response = raw
                call.trainable = call.completion_token_ids is not None
                calls.append(call)
            if self.sink is not None:  # the run's callback decorates and records them
                for h in self.sink.handlers:
                    h.hold_wire(self.sink.run_id, calls)
            elif self.handler is not None:
                for call in calls:
                    self.handler.record_call(call)
        except Exception as exc:  # recording must never break the caller's code
            handlers = self.sink.handlers if self.sink is not None else (self.handler,)
            for handler in handlers:
                if handler is not None:
                    _failed(handler, "recording an OpenAI call", exc)

    def answered(self, response: httpx.Response, raw: bytes) -> httpx.Response:
        """The response to hand on, its body read whole and recorded."""
        self.record(raw)
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
            request=self.request,
        )

    def streamed(self, response: httpx.Response) -> httpx.Response:
        """The response to hand on, its stream recorded as it passes."""
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_RecordingStream(response, self),
            extensions=response.extensions,
            request=self.request,
        )


class CapturingTransport(httpx.AsyncBaseTransport):
    """Records chat completions into the open `capture()`, or for the LangChain run that
    sends them (`capture.wire_sink`); see the module doc."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _Exchange.of(request)
        if exchange is None:
            return await self.inner.handle_async_request(request)
        response = await self.inner.handle_async_request(exchange.request)
        if response.status_code != 200:
            return response
        if exchange.body.get("stream"):
            return exchange.streamed(response)
        raw = await response.aread()
        await response.aclose()
        return exchange.answered(response, raw)

    async def aclose(self) -> None:
        await self.inner.aclose()


class CapturingSyncTransport(httpx.BaseTransport):
    """`CapturingTransport` for sync clients (a LangChain chat model's `invoke`)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _Exchange.of(request)
        if exchange is None:
            return self.inner.handle_request(request)
        response = self.inner.handle_request(exchange.request)
        if response.status_code != 200:
            return response
        if exchange.body.get("stream"):
            return exchange.streamed(response)
        raw = response.read()
        response.close()
        return exchange.answered(response, raw)

    def close(self) -> None:
        self.inner.close()


class ClientTransport(httpx.AsyncBaseTransport):
    """Sends through a caller's own `httpx.AsyncClient` (its proxies, certificates, hooks
    and pools), so a capturing transport can sit in front of a client it did not build."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.client.send(request, stream=True)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=response.stream,
            extensions=response.extensions,
        )


class ClientSyncTransport(httpx.BaseTransport):
    """`ClientTransport` for a caller's own sync `httpx.Client`."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.client.send(request, stream=True)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=response.stream,
            extensions=response.extensions,
        )


def _without_echoed_ids(body: dict[str, Any]) -> dict[str, Any]:
    """The request less the `token_ids` that assistant messages carry back to the server
    (`chat_model.py`'s round trip): the call that sampled them recorded them already."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not any(
        isinstance(m, dict) and "token_ids" in m for m in messages
    ):
        return body
    plain = [
        {k: v for k, v in m.items() if k != "token_ids"} if isinstance(m, dict) else m
        for m in messages
    ]
    return {**body, "messages": plain}


def _failed(handler: TrajectoryCallback, what: str, exc: Exception) -> None:
    log.warning("capture: %s failed: %r", what, exc)
    handler.trajectory.logs.append(f"capture: {what} failed: {exc!r}")


def responses_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request body -> the chat-completions kwargs it amounts to: `messages`
    (instructions and input items), chat-form `tools` and `tool_choice`, and the rest
    (sampling settings) as they were, less `input` and `instructions`."""
    out = {
        k: v for k, v in body.items() if k not in ("input", "instructions", "tools", "tool_choice")
    }
    out["messages"] = chat_messages(body.get("instructions"), body.get("input") or [])
    if tools := chat_tools([t for t in body.get("tools") or [] if t.get("type") == "function"]):
        out["tools"] = tools
    if "tool_choice" in body:
        out["tool_choice"] = chat_tool_choice(body["tool_choice"])
    return out


def _record_tool_results(handler: TrajectoryCallback, body: dict[str, Any], api: _Api) -> None:
    """Each tool result in the request (a `tool` message; a `function_call_output` item)
    that answers a tool call of a call recorded in this trajectory becomes a `ToolEvent`,
    once per `tool_call_id`."""
    try:
        if api == "responses":
            items = body.get("input")
            if not isinstance(items, list):
                return
            messages = chat_messages(None, [i for i in items if isinstance(i, dict)])
        else:
            messages = body.get("messages") or []
        results = {
            m["tool_call_id"]: m.get("content")
            for m in messages
            if isinstance(m, dict) and m.get("role") == "tool" and m.get("tool_call_id")
        }
        if not results:
            return
        asked = {
            tc.get("id"): tc.get("function") or {}
            for call in handler.trajectory.calls
            for tc in call.response_message.get("tool_calls") or []
        }
        for call_id, content in results.items():
            if call_id not in asked:
                continue
            fn = asked[call_id]
            raw_args = fn.get("arguments")
            try:
                args = json.loads(raw_args) if isinstance(raw_args, str) else raw_args
            except ValueError:
                args = raw_args
            event = ToolEvent(
                name=str(fn.get("name") or "tool"),
                args=args if isinstance(args, dict) else str(raw_args or ""),
                tool_call_id=call_id,
                result=content,
            )
            handler.record_tool_event(event)
    except Exception as exc:  # recording must never break the caller's code
        _failed(handler, "recording a tool result", exc)


class _RecordingStream(httpx.AsyncByteStream, httpx.SyncByteStream):
    """Passes the SSE bytes through and records the merged completion at the end."""

    def __init__(self, response: httpx.Response, exchange: _Exchange) -> None:
        self.response, self.exchange = response, exchange
        self.buffer, self.done = b"", False
        self.chunks: list[dict[str, Any]] = []

    def _feed(self, part: bytes) -> None:
        # Each part is read before it is handed on: a client stops at `[DONE]` and closes the
        # stream without asking for more, so the call is recorded when `[DONE]` arrives.
        self.buffer += part
        *events, self.buffer = self.buffer.split(b"\n\n")
        for event in events:
            for line in event.splitlines():
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    self.done = True
                    continue
                with contextlib.suppress(ValueError):  # not ours to judge
                    chunk = json.loads(data)
                    if self.exchange.api == "responses":
                        # the last event carries the whole response
                        if chunk.get("type") in _RESPONSE_DONE:
                            self.exchange.record(chunk.get("response") or {})
                    else:
                        self.chunks.append(chunk)
        if self.done and self.chunks and not any("error" in c for c in self.chunks):
            self.exchange.record(merge_stream_chunks(self.chunks))
            self.chunks = []

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.response.aiter_raw():
            self._feed(part)
            yield part

    def __iter__(self) -> Iterator[bytes]:
        for part in self.response.iter_raw():
            self._feed(part)
            yield part

    async def aclose(self) -> None:
        await self.response.aclose()

    def close(self) -> None:
        self.response.close()


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
