"""`TrainableChatModel`: a LangChain chat model served by the backend, with exact token ids.

Its requests go through the capturing transport of `model.openai_client()`
(`openai_capture.py`; a caller's own `http_client`/`http_async_client` is kept behind it),
and while one is under way its LangChain run's capture handler names the run, so
`art.capture()` records the call as it was sent, token ids and all, at the graph node
that made it (`capture.py`).

It is `langchain_openai.ChatOpenAI` pointed at the backend's OpenAI-compatible server,
so `bind_tools` (with `tool_choice`), `with_structured_output`, `invoke`/`ainvoke`/
`batch`/`stream`/`astream`, callbacks, tags and metadata behave as LangChain users
expect. Every call asks for token ids and their logprobs (`return_token_ids`,
`return_token_logprobs`: plain lists, not OpenAI's per-token logprob objects, which
stay available with `logprobs=True`). ChatOpenAI drops response fields it does not
know, so this subclass carries them into the message's `response_metadata`, for the
graph's own use and for the round trip below:

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

Inside `art.capture(seed=...)` (and `art.rollouts(..., seed=...)`), a request that sets
no `seed` of its own carries the block's next sampling seed.

The Responses API (`use_responses_api=True`) is captured and trains as well (its calls
cross the same transport), but Responses input items cannot carry an assistant turn's
`token_ids` back, so a multi-turn rollout there is re-rendered from text at each turn:
use chat completions (the default) for drift-free turns.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import model_validator

from art_langgraph.runtime.http_pool import shared_async_transport, sync_http_client
from art_langgraph.runtime.names import inference_name
from art_langgraph.tracing.callback import ART_METADATA_KEY, CHAT_MODEL_HEADER
from art_langgraph.tracing.capture import request_seed
from art_langgraph.tracing.openai_capture import (
    CapturingSyncTransport,
    CapturingTransport,
    ClientSyncTransport,
    ClientTransport,
)


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
            # marks its requests for the capturing transport (`openai_capture.py`)
            values["default_headers"] = {
                **(values.get("default_headers") or {}),
                CHAT_MODEL_HEADER: "1",
            }
            # Every request goes through the capturing transport (a client of the caller's
            # own is kept, behind it): `art.capture()` records the call as it was sent.
            own = values.get("http_async_client")
            inner: httpx.AsyncBaseTransport = (
                ClientTransport(own) if own is not None else shared_async_transport()
            )
            values["http_async_client"] = httpx.AsyncClient(
                transport=CapturingTransport(inner), timeout=None
            )
            values["http_client"] = httpx.Client(
                transport=CapturingSyncTransport(
                    ClientSyncTransport(values.get("http_client") or sync_http_client())
                ),
                timeout=None,
            )
        return values

    def _get_request_payload(
        self, input_: LanguageModelInput, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        if payload.get("seed") is None and (seed := request_seed()) is not None:
            if self._use_responses_api(payload):  # the SDK's responses.create has no seed=
                payload["extra_body"] = {**(payload.get("extra_body") or {}), "seed": seed}
            else:
                payload["seed"] = seed  # capture(seed=...): this run's next draw
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


CHAT_TIMEOUT = httpx.Timeout(None, connect=30.0)
"""`model.chat_model()`'s default timeout, as `model.openai_client()`'s: 30 s to connect,
then no deadline. A request waits its turn in the engine's queue, and on a busy CPU engine
that wait is long but alive (32 agents on a 2-core host took over 300 s, a deadline this
model once had, and each of its retries rejoined the back of the queue). A server that
dies closes the connection, and an engine step that fails answers every request it holds
with an error, so neither hangs; pass `timeout=` for a server you do not trust to answer."""


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
        timeout=kwargs.pop("timeout", None) or CHAT_TIMEOUT,
        **kwargs,
    )
