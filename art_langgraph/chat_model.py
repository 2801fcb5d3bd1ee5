"""`TrainableChatModel`: a LangChain chat model served by the backend, with exact token ids.

It is `langchain_openai.ChatOpenAI` pointed at the backend's OpenAI-compatible server,
so `bind_tools` (with `tool_choice`), `with_structured_output`, `invoke`/`ainvoke`/
`batch`/`stream`/`astream`, callbacks, tags and metadata behave as LangChain users
expect. Every call asks for logprobs and token ids (`return_token_ids`). ChatOpenAI
drops response fields it does not know, so this subclass carries them into the
message's `response_metadata`:

    prompt_token_ids   the exact prompt ids the engine saw (first chunk when streaming)
    token_ids          the completion ids it sampled (concatenated across stream chunks)
    model_name         "name@step": the adapter that served the call

Without a step the model asks for `name`, which the server resolves to the latest
adapter at each call, so a graph compiled before `model.train()` uses the new adapter
on its next call. With a step it asks for `name@step` (pinned, for evaluation).

Left out: the Responses API (`use_responses_api`), which the backend does not serve.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import openai
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

    Built directly or by `model.chat_model()`, it always asks for token ids and logprobs
    and marks its calls trainable for `art.capture()` (a user's `extra_body`/`metadata`
    are merged over these, never replaced)."""

    @model_validator(mode="before")
    @classmethod
    def _art_defaults(cls, values: Any) -> Any:
        if isinstance(values, dict):
            values = dict(values)
            values["extra_body"] = {"return_token_ids": True, **(values.get("extra_body") or {})}
            values["metadata"] = {ART_METADATA_KEY: True, **(values.get("metadata") or {})}
            values.setdefault("logprobs", True)
            values.setdefault("stream_usage", True)
        return values

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
        meta = gen.message.response_metadata
        if chunk.get("prompt_token_ids") is not None:
            meta["prompt_token_ids"] = chunk["prompt_token_ids"]
        choices = chunk.get("choices") or []
        if choices and choices[0].get("token_ids"):
            meta["token_ids"] = list(choices[0]["token_ids"])  # lists concatenate when chunks merge
        if choices and choices[0].get("finish_reason") and chunk.get("model"):
            meta["model_name"] = chunk["model"]
        return gen


def build_chat_model(
    *, name: str, step: int | None, base_url: str, api_key: str, **kwargs: Any
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


class _PerLoopTransport(httpx.AsyncBaseTransport):
    """Delegates to one `httpx.AsyncHTTPTransport` per running event loop."""

    def __init__(self, **transport_kwargs: Any) -> None:
        self._pools: PerLoop[httpx.AsyncHTTPTransport] = PerLoop(
            lambda: httpx.AsyncHTTPTransport(**transport_kwargs)
        )

    def _pool(self) -> httpx.AsyncHTTPTransport:
        return self._pools.get()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._pool().handle_async_request(request)

    async def aclose(self) -> None:
        """Shared by every client: closing one client leaves the pools open (idle
        connections expire after `keepalive_expiry`; a pool is dropped once its loop is
        closed)."""


_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=5.0)
_ASYNC_TRANSPORT = _PerLoopTransport(limits=_LIMITS)
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
