"""`TrainableChatModel`: a LangChain chat model served by the backend, with exact token ids.

It is `langchain_openai.ChatOpenAI` pointed at the backend's OpenAI-compatible server,
so `bind_tools` (with `tool_choice`), `with_structured_output`, `invoke`/`ainvoke`/
`batch`/`stream`/`astream`, callbacks, tags and metadata behave as LangChain users
expect. Every call asks for token ids and their logprobs (`return_token_ids`,
`return_token_logprobs`: plain lists, not OpenAI's per-token logprob objects, which
stay available with `logprobs=True`). ChatOpenAI drops response fields it does not
know, so this subclass carries them into the message's `response_metadata`:

    prompt_token_ids   the exact prompt ids the engine saw (first chunk when streaming)
    token_ids          the completion ids it sampled (concatenated across stream chunks)
    token_logprobs     each sampled token's logprob (concatenated the same way)
    model_name         "name@step": the adapter that served the call

Each assistant message of the history that carries `token_ids` in its
`response_metadata` (a reply of this server) goes back to the server with them, as the
message's `token_ids`: the server renders that turn as exactly the ids it sampled, so the
next prompt extends the previous prompt + completion token for token (the trainer then
trains a rollout as one sequence, and a prefix cache hits) however the sampler split the
text. The server checks them against the message and renders from text where they
disagree (a message edited in the graph).

Without a step the model asks for `name`, which the server resolves to the latest
adapter at each call, so a graph compiled before `model.train()` uses the new adapter
on its next call. With a step it asks for `name@step` (pinned, for evaluation); with
promotion on (`ModelConfig.promote_on_evaluation`), `model.chat_model()` asks for
`name@latest`, as the bare name then serves the promoted step.

Left out: the Responses API (`use_responses_api`): the backend serves it (for the OpenAI
Agents SDK, `model.openai_client()`), but this model speaks chat completions, whose
assistant messages can carry their `token_ids` back to the server.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import model_validator

from art_langgraph.loops import PerLoop
from art_langgraph.names import inference_name

__all__ = [
    "ART_METADATA_KEY",
    "TrainableChatModel",
    "async_http_client",
    "shared_async_transport",
    "sync_http_client",
]

ART_METADATA_KEY = "art_trainable"
"""Metadata key that marks a chat model's calls as trainable for the capture handler."""


class TrainableChatModel(ChatOpenAI):
    """ChatOpenAI against the backend, recording token ids in `response_metadata`.

    Built directly or by `model.chat_model()`, it always asks for token ids and their logprobs
    and marks its calls trainable for `art.capture()` (a user's `extra_body`/`metadata`
    are merged over these, never replaced)."""

    @model_validator(mode="before")
    @classmethod
    def _art_defaults(cls, values: Any) -> Any:
        if isinstance(values, dict):
            values = dict(values)
            values["extra_body"] = {
                "return_token_ids": True,
                "return_token_logprobs": True,
                **(values.get("extra_body") or {}),
            }
            values["metadata"] = {ART_METADATA_KEY: True, **(values.get("metadata") or {})}
            values.setdefault("stream_usage", True)
        return values

    def _get_request_payload(
        self, input_: LanguageModelInput, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        sent = payload.get("messages")
        messages = self._convert_input(input_).to_messages()
        if isinstance(sent, list) and len(sent) == len(messages):
            for message, body in zip(messages, sent, strict=True):
                ids = message.response_metadata.get("token_ids")
                if isinstance(message, AIMessage) and ids and body.get("role") == "assistant":
                    body["token_ids"] = list(ids)
        return payload

    def _create_chat_result(
        self, response: dict | openai.BaseModel, generation_info: dict | None = None
    ) -> ChatResult:
        result = super()._create_chat_result(response, generation_info)
        body = response if isinstance(response, dict) else response.model_dump(warnings=False)
        prompt_ids = body.get("prompt_token_ids")
        for gen, choice in zip(result.generations, body.get("choices") or [], strict=False):
            meta = gen.message.response_metadata
            if prompt_ids is not None:
                meta["prompt_token_ids"] = prompt_ids
            if choice.get("token_ids") is not None:
                meta["token_ids"] = choice["token_ids"]
            if choice.get("token_logprobs") is not None:
                meta["token_logprobs"] = choice["token_logprobs"]
            if body.get("model"):
                meta["model_name"] = body["model"]
        return result

    def _convert_chunk_to_generation_chunk(
        self, chunk: dict, default_chunk_class: type, base_generation_info: dict | None
    ) -> ChatGenerationChunk | None:
        gen = super()._convert_chunk_to_generation_chunk(
            chunk, default_chunk_class, base_generation_info
        )
        if gen is None:
            return None
        # A `response_format` call (`with_structured_output`) streams through openai's
        # `beta.chat.completions.stream`, whose events wrap the server's chunk:
        # {"type": "chunk", "chunk": {...}, "snapshot": ...}; its other events carry no ids.
        # Such a stream ends with a chunk of the final completion that carries the model
        # name (in `generation_info`) but none of the ids, so only the ids are read here.
        wrapped = chunk.get("type") == "chunk"
        raw = chunk.get("chunk") if wrapped else chunk
        if not isinstance(raw, dict):
            return gen
        meta = gen.message.response_metadata
        if raw.get("prompt_token_ids") is not None:
            meta["prompt_token_ids"] = raw["prompt_token_ids"]
        choices = raw.get("choices") or []
        if choices and choices[0].get("token_ids"):
            meta["token_ids"] = list(choices[0]["token_ids"])  # lists concatenate when chunks merge
        if choices and choices[0].get("token_logprobs"):
            meta["token_logprobs"] = list(choices[0]["token_logprobs"])
        if not wrapped and choices and choices[0].get("finish_reason") and raw.get("model"):
            meta["model_name"] = raw["model"]
        return gen


def build_chat_model(
    *, name: str, step: int | str | None, base_url: str, api_key: str, **kwargs: Any
) -> TrainableChatModel:
    """The chat model for `model.chat_model()`; kwargs go to ChatOpenAI (temperature, max_tokens, ...)."""
    metadata = {"art_model": name, **(kwargs.pop("metadata", None) or {})}
    return TrainableChatModel(
        model=inference_name(name, step),
        base_url=base_url,
        api_key=api_key,  # type: ignore[arg-type]
        metadata=metadata,
        max_retries=kwargs.pop("max_retries", 2),
        # 300 s bounds any wait, then max_retries retries.
        timeout=kwargs.pop("timeout", None) or httpx.Timeout(300.0, connect=30.0),
        # Our own HTTP clients, never LangChain's or openai's defaults (see HTTP clients below).
        http_client=kwargs.pop("http_client", None) or sync_http_client(),
        http_async_client=kwargs.pop("http_async_client", None) or async_http_client(),
        **kwargs,
    )


# ------------------------------------------------------------------ HTTP clients
#
# Why not the defaults: langchain_openai's and openai's default async clients close
# themselves from `__del__`, by scheduling `aclose()` on whatever event loop is running
# in the thread where the garbage collector runs. Seen in the test suite: such an
# `aclose()` aborted transports whose fd numbers live connections had reused by then
# (the transports' own sockets already closed, most likely by their finalizers in the
# same collection), and `loop._remove_reader(fd)` unregistered the live sockets: their
# requests waited for responses that had already arrived, until the request timeout.
# Also seen: that `aclose()` running on the server thread's loop against the transports
# of the caller's loop. Chat models and clients created per call made it frequent; 200
# concurrent rollouts (tests/langgraph/test_drift.py) hit it within a minute.
#
# Here: plain httpx clients (no `__del__`) over one transport that keeps a connection
# pool per event loop (a pool's connections belong to the loop that opened them) and
# that a client's `aclose()` never closes: a pool lives as long as its loop.
#
# The pools are aiohttp's (through `httpx_aiohttp`, what openai's `DefaultAioHttpClient`
# uses), not httpcore's: httpcore checks every pooled connection (a poll and several
# socket calls each) every time a request starts or ends, so N concurrent requests cost
# O(N^2) of them. Measured on the tiny preset, 32 concurrent chat completions of 32
# tokens through the server: 0.36 s with httpcore's pool, 0.23 s with aiohttp's, 0.15 s
# for the engine alone (bench/rl_step's generation column has the side-by-side figure).


class _LoopPool:
    """One event loop's aiohttp session, closed when that loop shuts down."""

    def __init__(self, limits: httpx.Limits) -> None:
        import aiohttp
        from httpx_aiohttp import AiohttpTransport

        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=limits.max_connections or 0, keepalive_timeout=limits.keepalive_expiry
            )
        )
        self.transport = AiohttpTransport(client=self.session)
        self._guard: Any = None

    async def guard(self) -> None:
        """Close the session inside its loop when the loop shuts down: `asyncio.run` (and
        every `asyncio.Runner`) closes the async generators a loop started before it closes
        the loop, and this one's `finally` closes the session and its connections."""
        if self._guard is None:
            self._guard = self._close_at_shutdown()
            await self._guard.__anext__()

    async def _close_at_shutdown(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.session.close()

    def drop(self) -> None:
        """The loop closed without shutting its generators down: mark the session and its
        connector closed (on a closed loop aiohttp touches no transport; the sockets close
        with their transports), so neither complains when collected."""
        connector = self.session.connector
        self.session.detach()
        if connector is not None:
            waiter: Any = connector.close()  # closes nothing on a closed loop: a no-op awaitable
            with contextlib.suppress(StopIteration):
                waiter.__await__().send(None)


class _PerLoopTransport(httpx.AsyncBaseTransport):
    """Delegates to one aiohttp-backed pool per running event loop."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._pools: PerLoop[_LoopPool] = PerLoop(lambda: _LoopPool(limits), _LoopPool.drop)

    def _pool(self) -> _LoopPool:
        return self._pools.get()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pool = self._pool()
        await pool.guard()
        try:
            return await pool.transport.handle_async_request(request)
        except httpx.TransportError as exc:
            raise _plain_error(exc) from exc.__cause__

    async def aclose(self) -> None:
        """Shared by every client: closing one client leaves the pools open (idle
        connections expire after `keepalive_expiry`; a pool closes with its loop)."""


def _plain_error(exc: httpx.TransportError) -> httpx.TransportError:
    """httpx's own error for what aiohttp reported: `httpx_aiohttp` maps a refused
    connection and a server that hung up to `ConnectTimeout`, which openai reports as
    "Request timed out"."""
    import aiohttp

    cause = exc.__cause__
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    if isinstance(cause, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(cause))
    if isinstance(cause, aiohttp.ClientOSError):
        return httpx.ReadError(str(cause))
    return exc


_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=5.0)
_ASYNC_TRANSPORT = _PerLoopTransport(_LIMITS)
_SYNC_CLIENT: httpx.Client | None = None
_SYNC_LOCK = threading.Lock()


def shared_async_transport() -> httpx.AsyncBaseTransport:
    """The transport over the shared per-loop pools (closing it closes nothing)."""
    return _ASYNC_TRANSPORT


def async_http_client() -> httpx.AsyncClient:
    """A plain AsyncClient over the shared per-loop pools (cheap; closing it closes no pool)."""
    return httpx.AsyncClient(transport=_ASYNC_TRANSPORT, timeout=None)


def sync_http_client() -> httpx.Client:
    """The process-wide sync client (sync sockets have no event loop; one pool serves all)."""
    global _SYNC_CLIENT
    with _SYNC_LOCK:
        if _SYNC_CLIENT is None or _SYNC_CLIENT.is_closed:
            _SYNC_CLIENT = httpx.Client(limits=_LIMITS, timeout=None)
        return _SYNC_CLIENT
