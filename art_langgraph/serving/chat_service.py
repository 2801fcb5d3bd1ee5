"""`ChatService`: the OpenAI chat-completions translation around an engine, without HTTP.

It turns a request body into an engine plan (`parse`, then `plan`: model resolution,
chat template, tool mode, grammar for forced tool calls and `response_format`, limits),
runs it (`generate`, `stream`), and turns engine results into the typed responses of
`chat_protocol.py` (text cut at stop strings, tool calls parsed, logprobs per token, token
ids). The HTTP routes (`app.py`) only move bytes, wait while a step trains, and
cancel work whose client left; everything here is unit-testable with an engine alone.
The Responses API (`responses.py`) runs on the same plans, results and typed chunks.

Usage is OpenAI's: the prompt counted once however many choices (`n`), completion tokens
summed over the choices, and `prompt_tokens_details.cached_tokens` the prompt tokens
that came from the engine's prefix cache; with n > 1, the fewest any choice had, so a
choice that reused a sibling's prefill does not count as a hit of the request. A stream
sends the same usage in its last chunk when asked (`stream_options.include_usage`).

Errors are `ServiceError`s carrying the OpenAI error fields and an HTTP status: 400 for
malformed input, 404 for an unknown model, 500 when the engine fails. A model's
malformed tool-call output comes back as plain content, never as an error.

Left out: the legacy `/v1/completions` and embeddings.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from art_langgraph.chat.format import (
    ToolCallHoldback,
    parse_tool_calls,
    render_prompt,
    template_messages,
)
from art_langgraph.engine.base import GenerateResult, InferenceEngine, SamplingParams, TokenEvent
from art_langgraph.errors import (
    ContextLengthError,
    InfrastructureError,
    UnknownModelError,
    UsageError,
)
from art_langgraph.serving.chat_protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    NamedToolChoice,
    PromptTokensDetails,
    ResponseMessage,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from art_langgraph.serving.config import ServerConfig
from art_langgraph.serving.registry import ModelRegistry, Served

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """An OpenAI-style error: HTTP status, message, type, code and param."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = (
            status,
            message,
            kind,
            code,
            param,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class Plan:
    """A validated request, ready for the engine."""

    req: ChatCompletionRequest
    served: Served
    prompt_ids: list[int]
    samplings: list[SamplingParams]
    parse_tools: bool


class ChatService:
    """Chat completions on `engine` for the models in `registry` (see the module doc)."""

    def __init__(
        self, engine: InferenceEngine, registry: ModelRegistry, limits: ServerConfig
    ) -> None:
        self.engine, self.registry, self.limits = engine, registry, limits
        self.tok = engine.tokenizer

        @functools.lru_cache(maxsize=1 << 16)
        def token_text(token_id: int) -> str:
            """One token's text, decoded once per service (logprobs name every token)."""
            return str(self.tok.decode([token_id]))

        self.token_text = token_text

    # ------------------------------------------------------------------ requests
    def parse(self, raw: bytes) -> ChatCompletionRequest:
        """Body bytes -> a validated request, or a 400 saying what is wrong."""
        return parse_request(raw, self.limits.max_json_depth)

    def plan(self, req: ChatCompletionRequest) -> Plan:
        try:
            served = self.registry.resolve(req.model)
        except UnknownModelError as exc:
            raise ServiceError(
                404, str(exc), "invalid_request_error", "model_not_found", "model"
            ) from None
        try:
            mode = req.mode()
            messages = template_messages(req.message_dicts())
            tools = req.tool_dicts() if mode != "none" else None
            prompt = render_prompt(self.tok, messages, tools)
            n_prompt, ctx = len(prompt), self.engine.context_length
            limit = req.completion_limit()
            if n_prompt >= ctx:
                raise ContextLengthError(n_prompt, None, ctx)
            if limit is not None and n_prompt + limit > ctx:
                raise ContextLengthError(n_prompt, limit, ctx)
            max_tokens = limit or min(self.limits.default_max_tokens, ctx - n_prompt)
            if req.n * max_tokens > self.limits.max_request_tokens:
                raise UsageError(
                    f"n x max_tokens = {req.n} x {max_tokens} = {req.n * max_tokens} completion "
                    f"tokens, more than this server allows in one request "
                    f"({self.limits.max_request_tokens}); lower n or max_tokens"
                )
            grammar = self._grammar(req, mode, tools)
            samplings = [
                SamplingParams(
                    max_tokens=max_tokens,
                    temperature=1.0 if req.temperature is None else req.temperature,
                    top_p=1.0 if req.top_p is None else req.top_p,
                    stop=tuple(req.stop or ()),
                    seed=None if req.seed is None else (req.seed + i) % 2**64,
                    top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
                    grammar=grammar,
                    ignore_eos=req.ignore_eos,
                )
                for i in range(req.n)
            ]
        except (UsageError, ValueError) as exc:
            raise ServiceError(400, str(exc)) from None
        return Plan(req, served, prompt, samplings, parse_tools=mode != "none")

    def _grammar(
        self, req: ChatCompletionRequest, mode: str, tools: list[dict[str, Any]] | None
    ) -> str | None:
        grammars = self.engine.grammars
        rf = req.response_format or {}
        forced = mode in ("required", "named")
        if sum([forced, rf.get("type", "text") != "text", req.structured_outputs is not None]) > 1:
            raise UsageError(
                "use one constraint at a time: response_format, structured_outputs or a forced tool_choice"
            )
        if so := req.structured_outputs:
            return grammars.structured(so)
        if rf.get("type") == "json_schema":
            return grammars.json_schema(rf["json_schema"].get("schema", {}))
        if rf.get("type") == "json_object":
            return grammars.json_object()
        if mode == "required":
            assert tools is not None
            if (allowed := req.allowed_names()) is not None:
                missing = sorted(set(allowed) - {t["function"]["name"] for t in tools})
                if missing:
                    raise UsageError(f"allowed_tools names {missing}, not among the tools")
                tools = [t for t in tools if t["function"]["name"] in allowed]
            return grammars.tool_calls(tools, parallel=req.parallel_tool_calls)
        if mode == "named":
            assert tools is not None and isinstance(req.tool_choice, NamedToolChoice)
            want = req.tool_choice.function.name
            chosen = [t for t in tools if t["function"]["name"] == want]
            if not chosen:
                raise UsageError(f"tool_choice names {want!r}, which is not among the tools")
            return grammars.tool_calls(chosen, parallel=False)
        return None

    async def ensure_adapter(self, plan: Plan) -> None:
        """Load the plan's adapter from disk if the engine dropped it (an old pinned step)."""
        adapter = plan.served.adapter
        if adapter is None or not plan.served.path or adapter in self.engine.list_adapters():
            return
        try:
            await self.engine.load_adapter(adapter, plan.served.path)
        except UsageError as exc:
            raise ServiceError(
                500, f"cannot load {plan.served.label}: {exc}", "server_error"
            ) from None

    # ---------------------------------------------------------------- generation
    async def generate(self, plan: Plan) -> list[GenerateResult]:
        """All of the plan's choices, at most `max_parallel_choices` decoding at once."""
        share = asyncio.Semaphore(self.limits.max_parallel_choices)

        async def one(s: SamplingParams) -> GenerateResult:
            async with share:
                return await self.engine.generate(plan.prompt_ids, s, plan.served.adapter)

        try:
            return list(await asyncio.gather(*(one(s) for s in plan.samplings)))
        except UsageError as exc:
            raise ServiceError(400, str(exc)) from None
        except InfrastructureError as exc:
            raise ServiceError(500, str(exc), "server_error") from None

    # ----------------------------------------------------------------- responses
    def text(self, result: GenerateResult) -> str:
        text = self.tok.decode(result.completion_token_ids, skip_special_tokens=True)
        if isinstance(result.stop_reason, str) and (at := text.find(result.stop_reason)) >= 0:
            text = text[:at]
        return str(text)

    def logprobs(self, ids: list[int], lps: list[float], tops: list[Any] | None) -> ChoiceLogprobs:
        content = []
        for j, (t, lp) in enumerate(zip(ids, lps, strict=True)):
            s = self.token_text(t)
            top = []
            if tops is not None:
                top = [
                    TopLogprob.model_construct(
                        token=(a := self.token_text(i)), logprob=v, bytes=list(a.encode())
                    )
                    for i, v in tops[j]
                ]
            content.append(
                TokenLogprob.model_construct(
                    token=s, logprob=lp, bytes=list(s.encode()), top_logprobs=top
                )
            )
        return ChoiceLogprobs.model_construct(content=content)

    def message(self, plan: Plan, result: GenerateResult) -> tuple[ResponseMessage, str]:
        text = self.text(result)
        message = ResponseMessage(content=text)
        finish: str = "stop" if result.finish_reason == "abort" else result.finish_reason
        if plan.parse_tools:
            parsed = parse_tool_calls(text)
            if parsed.malformed:
                log.info("malformed tool call kept as content: %.200r", text)
            message.content = parsed.content
            if parsed.tool_calls:
                message.tool_calls = parsed.tool_calls
                finish = "tool_calls"
        return message, finish

    def response(self, plan: Plan, results: list[GenerateResult]) -> ChatCompletion:
        req = plan.req
        choices = []
        for i, r in enumerate(results):
            message, finish = self.message(plan, r)
            choice = Choice(index=i, message=message, finish_reason=finish)
            if req.logprobs:
                choice.logprobs = self.logprobs(r.completion_token_ids, r.logprobs, r.top_logprobs)
            if req.return_token_ids:
                choice.token_ids = r.completion_token_ids
            if req.return_token_logprobs:
                choice.token_logprobs = r.logprobs
            choice.stop_reason = r.stop_reason
            choices.append(choice)
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=plan.served.label,
            choices=choices,
            usage=_usage(plan, results),
            prompt_token_ids=plan.prompt_ids if req.return_token_ids else None,
        )

    def _token_extras(
        self, ch: ChunkChoice, req: ChatCompletionRequest, events: list[TokenEvent]
    ) -> None:
        """What a chunk carries about its tokens, as the request asked."""
        if req.logprobs:
            ch.logprobs = self.logprobs(
                [e.token_id for e in events],
                [e.logprob for e in events],
                [e.top for e in events] if events[0].top is not None else None,
            )
        if req.return_token_ids:
            ch.token_ids = [e.token_id for e in events]
        if req.return_token_logprobs:
            ch.token_logprobs = [e.logprob for e in events]

    async def stream(self, plan: Plan) -> AsyncIterator[str]:
        """The plan's choices as server-sent events, ending with `data: [DONE]`."""
        async with contextlib.aclosing(self.stream_chunks(plan)) as chunks:
            async for item in chunks:
                if isinstance(item, ServiceError):
                    yield f"data: {json.dumps(item.body())}\n\n"
                    return
                yield f"data: {item.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"

    async def stream_chunks(
        self, plan: Plan
    ) -> AsyncGenerator[ChatCompletionChunk | ServiceError, None]:
        """The plan's choices as typed chunks; an engine failure ends them with a
        `ServiceError` (what `stream` and the Responses stream send as an error event)."""
        req = plan.req
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        q: asyncio.Queue[tuple[int, TokenEvent | GenerateResult | BaseException]] = asyncio.Queue()
        share = asyncio.Semaphore(self.limits.max_parallel_choices)

        async def pump(i: int, s: SamplingParams) -> None:
            try:
                async with share:
                    async for item in self.engine.stream(plan.prompt_ids, s, plan.served.adapter):
                        await q.put((i, item))
            except BaseException as exc:  # delivered to the client as an error event
                await q.put((i, exc))

        def chunk(choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
            return ChatCompletionChunk(
                id=cid, created=created, model=plan.served.label, choices=choices, **extra
            )

        n = len(plan.samplings)
        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(plan.samplings)]
        ids: list[list[int]] = [[] for _ in range(n)]
        sent_text = [0] * n
        holds = [ToolCallHoldback() for _ in range(n)]
        pending: list[list[TokenEvent]] = [[] for _ in range(n)]  # tokens not yet in a chunk
        finished: list[GenerateResult] = []  # for the usage chunk
        open_ = len(tasks)
        first = {"prompt_token_ids": plan.prompt_ids} if req.return_token_ids else {}
        try:
            yield chunk(
                [ChunkChoice(index=i, delta=Delta(role="assistant", content="")) for i in range(n)],
                **first,
            )
            while open_:
                i, item = await q.get()
                if isinstance(item, BaseException):
                    msg = (
                        str(item)
                        if isinstance(item, UsageError | InfrastructureError)
                        else repr(item)
                    )
                    yield ServiceError(500, msg, "server_error")
                    return
                if isinstance(item, TokenEvent):
                    ids[i].append(item.token_id)
                    pending[i].append(item)
                    text = self.tok.decode(ids[i], skip_special_tokens=True)
                    if text.endswith("\ufffd"):
                        continue  # an incomplete UTF-8 sequence: wait for the next token
                    new = holds[i].release(text) if plan.parse_tools else text[sent_text[i] :]
                    sent_text[i] = len(text)
                    if not new and not (
                        req.return_token_ids or req.logprobs or req.return_token_logprobs
                    ):
                        continue
                    ch = ChunkChoice(index=i, delta=Delta(content=new or None))
                    self._token_extras(ch, req, pending[i])
                    pending[i] = []
                    yield chunk([ch])
                    continue
                # The finished result: flush what was held back.
                open_ -= 1
                finished.append(item)
                message, finish = self.message(plan, item)
                delta = Delta()
                if plan.parse_tools:
                    if message.tool_calls:
                        delta.tool_calls = [
                            {"index": k, **tc} for k, tc in enumerate(message.tool_calls)
                        ]
                    elif rest := (message.content or "")[holds[i].sent :]:
                        delta.content = rest
                else:
                    full = self.text(item)
                    if len(full) > sent_text[i]:  # a stop string is cut: never send past it
                        delta.content = full[sent_text[i] :]
                ch = ChunkChoice(
                    index=i, delta=delta, finish_reason=finish, stop_reason=item.stop_reason
                )
                if pending[i]:  # tokens held back (an incomplete UTF-8 sequence)
                    self._token_extras(ch, req, pending[i])
                yield chunk([ch])
            if req.stream_options and req.stream_options.include_usage:
                yield chunk([], usage=_usage(plan, finished))
        finally:
            for t in tasks:
                t.cancel()


def _usage(plan: Plan, results: list[GenerateResult]) -> Usage:
    """One request's usage (see the module doc): the prompt once, completions summed."""
    n_prompt = len(plan.prompt_ids)
    completion = sum(len(r.completion_token_ids) for r in results)
    cached = min((r.cached_tokens for r in results), default=0)
    return Usage(
        prompt_tokens=n_prompt,
        completion_tokens=completion,
        total_tokens=n_prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


# --------------------------------------------------------------------- parsing
def validation_message(errors: Any) -> str:
    """A pydantic error list -> one line naming the first field and what is wrong."""
    first = errors[0] if errors else {}
    loc = ""
    for part in first.get("loc", ()):
        if part == "body":
            continue
        loc += f"[{part}]" if isinstance(part, int) else f".{part}" if loc else str(part)
    msg = str(first.get("msg", "invalid request"))
    return f"{loc}: {msg}" if loc else msg


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_request(raw: bytes, max_depth: int) -> ChatCompletionRequest:
    """Body bytes -> a validated request, or a ServiceError 400 saying what is wrong."""
    body = parse_json_body(raw, max_depth)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise ServiceError(400, validation_message(exc.errors())) from None


def parse_json_body(raw: bytes, max_depth: int) -> dict[str, Any]:
    """Body bytes -> a JSON object within the depth limit, or a ServiceError 400."""
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise ServiceError(
            400, f"the request body is nested deeper than {max_depth} levels"
        ) from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity
        raise ServiceError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ServiceError(400, "the request body must be a JSON object")
    if problem := _check_json(body, max_depth):
        raise ServiceError(400, problem)
    return body


def _check_json(value: Any, max_depth: int) -> str | None:
    """Depth and text checks pydantic does not make: nesting deeper than `max_depth`, and
    strings that are not valid Unicode (a lone surrogate cannot become UTF-8)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth > max_depth:
                return f"the request body is nested deeper than {max_depth} levels"
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str) and not _utf8_ok(k):
                    return f"the key {k.encode('utf-8', 'replace')!r} is not valid Unicode"
                stack.append((x, depth + 1))
        elif isinstance(v, str) and not _utf8_ok(v):
            return "a string in the request body holds a lone surrogate (not valid Unicode)"
    return None


def _utf8_ok(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
