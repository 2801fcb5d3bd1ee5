"""The OpenAI-compatible HTTP server around an `InferenceEngine` (FastAPI).

Endpoints: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions` (messages,
tools and tool_choice, sampling, n, stop, seed, logprobs, response_format with JSON
schemas, SSE streaming). With `"return_token_ids": true` a response carries
`prompt_token_ids` (top level) and `token_ids` per choice, as vLLM names them. The
response's `model` is `name@step` for the weights that answered.

Errors are OpenAI-style JSON bodies: 400 for malformed input (a prompt too long for the
context names both lengths), 401 for a wrong or missing API key, 404 for an unknown
model, 500 when the engine fails. A model's malformed tool-call output comes back as
plain content, never as an error.

Left out: the legacy `/v1/completions`, embeddings, and adapter management over HTTP
(the backend loads adapters in-process).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from art_langgraph.backend.guard import Guard
from art_langgraph.backend.protocol import ChatCompletionRequest, NamedToolChoice
from art_langgraph.backend.registry import ModelRegistry, Served
from art_langgraph.backend.server_config import ServerConfig
from art_langgraph.engine.base import GenerateResult, InferenceEngine, SamplingParams, TokenEvent
from art_langgraph.engine.chat_format import (
    ToolCallHoldback,
    normalize_messages,
    parse_tool_calls,
    render_prompt,
)
from art_langgraph.errors import (
    ContextLengthError,
    InfrastructureError,
    UnknownModelError,
    UsageError,
)

__all__ = ["create_app", "validation_message"]

log = logging.getLogger(__name__)


class _HTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
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


def _error_body(
    status: int, message: str, kind: str, code: str | None = None, param: str | None = None
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "param": param, "code": code}},
    )


@dataclass
class _Plan:
    """A validated request, ready for the engine."""

    req: ChatCompletionRequest
    served: Served
    prompt_ids: list[int]
    samplings: list[SamplingParams]
    parse_tools: bool


def create_app(
    engine: InferenceEngine,
    registry: ModelRegistry,
    *,
    api_key: str | None = None,
    config: ServerConfig | None = None,
) -> FastAPI:
    """The FastAPI app; run it with uvicorn (see `backend/runner.py`)."""
    if api_key is not None and not api_key.strip():
        raise UsageError("the API key is empty or whitespace: pass a real key, or none")
    limits = config or ServerConfig()
    app = FastAPI(title="art_langgraph", docs_url=None, redoc_url=None)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=limits.max_body_bytes)
    tok = engine.tokenizer
    # Parsing, validation, chat templates and tokenization run here, one request at a time,
    # never on the event loop: a large prompt must not stall /health or other clients.
    cpu = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-render")

    async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(cpu, fn, *args)

    @functools.lru_cache(maxsize=1 << 16)
    def token_text(token_id: int) -> str:
        """One token's text, decoded once per server (logprobs name every token)."""
        return str(tok.decode([token_id]))

    @app.exception_handler(_HTTPError)
    async def _http_error(_: Request, exc: _HTTPError) -> JSONResponse:
        return _error_body(exc.status, exc.message, exc.kind, exc.code, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_body(400, validation_message(exc.errors()), "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def _starlette(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_body(exc.status_code, str(exc.detail), "invalid_request_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": registry.labels(), "adapters": engine.list_adapters()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(time.time())
        data = []
        for name in registry.names():
            data.append(
                {"id": name, "object": "model", "created": created, "owned_by": "art_langgraph"}
            )
        for label in registry.labels():
            data.append(
                {"id": label, "object": "model", "created": created, "owned_by": "art_langgraph"}
            )
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        raw = await request.body()  # the Guard bounds its size
        req: ChatCompletionRequest = await off_loop(_parse, raw, limits.max_json_depth)
        while registry.is_paused(req.model):  # a step is training: wait for it (ART's semantics)
            if await request.is_disconnected():
                return None
            await asyncio.sleep(0.005)
        plan: _Plan = await off_loop(_plan, req)
        adapter = plan.served.adapter
        if adapter is not None and plan.served.path and adapter not in engine.list_adapters():
            try:
                await engine.load_adapter(adapter, plan.served.path)
            except UsageError as exc:
                raise _HTTPError(
                    500, f"cannot load {plan.served.label}: {exc}", "server_error"
                ) from None
        if req.stream:
            return StreamingResponse(_stream(plan), media_type="text/event-stream")
        share = asyncio.Semaphore(limits.max_parallel_choices)

        async def one(s: SamplingParams) -> GenerateResult:
            async with share:
                return await engine.generate(plan.prompt_ids, s, plan.served.adapter)

        try:
            results = await _unless_disconnected(
                request, asyncio.gather(*(one(s) for s in plan.samplings))
            )
        except UsageError as exc:
            raise _HTTPError(400, str(exc), "invalid_request_error") from None
        except InfrastructureError as exc:
            raise _HTTPError(500, str(exc), "server_error") from None
        if results is None:
            return None  # the client left: its rows were cancelled, nobody reads an answer
        return _response(plan, results)

    def _plan(req: ChatCompletionRequest) -> _Plan:
        try:
            served = registry.resolve(req.model)
        except UnknownModelError as exc:
            raise _HTTPError(
                404, str(exc), "invalid_request_error", "model_not_found", "model"
            ) from None
        try:
            mode = req.mode()
            messages = normalize_messages(req.message_dicts())
            tools = req.tool_dicts() if mode != "none" else None
            prompt = render_prompt(tok, messages, tools)
            n_prompt, ctx = len(prompt), engine.context_length
            limit = req.completion_limit()
            if n_prompt >= ctx:
                raise ContextLengthError(n_prompt, None, ctx)
            if limit is not None and n_prompt + limit > ctx:
                raise ContextLengthError(n_prompt, limit, ctx)
            max_tokens = limit or min(limits.default_max_tokens, ctx - n_prompt)
            if req.n * max_tokens > limits.max_request_tokens:
                raise UsageError(
                    f"n x max_tokens = {req.n} x {max_tokens} = {req.n * max_tokens} completion "
                    f"tokens, more than this server allows in one request "
                    f"({limits.max_request_tokens}); lower n or max_tokens"
                )
            grammar = _grammar(req, mode, tools)
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
            raise _HTTPError(400, str(exc), "invalid_request_error") from None
        return _Plan(req, served, prompt, samplings, parse_tools=mode != "none")

    def _grammar(
        req: ChatCompletionRequest, mode: str, tools: list[dict[str, Any]] | None
    ) -> str | None:
        rf = req.response_format or {}
        forced = mode in ("required", "named")
        if sum([forced, rf.get("type", "text") != "text", req.structured_outputs is not None]) > 1:
            raise UsageError(
                "use one constraint at a time: response_format, structured_outputs or a forced tool_choice"
            )
        if so := req.structured_outputs:
            return engine.grammars.structured(so)
        if rf.get("type") == "json_schema":
            return engine.grammars.json_schema(rf["json_schema"].get("schema", {}))
        if rf.get("type") == "json_object":
            return engine.grammars.json_object()
        if mode == "required":
            assert tools is not None
            return engine.grammars.tool_calls(tools, parallel=req.parallel_tool_calls)
        if mode == "named":
            assert tools is not None and isinstance(req.tool_choice, NamedToolChoice)
            want = req.tool_choice.function.name
            chosen = [t for t in tools if t["function"]["name"] == want]
            if not chosen:
                raise UsageError(f"tool_choice names {want!r}, which is not among the tools")
            return engine.grammars.tool_calls(chosen, parallel=False)
        return None

    def _text(result: GenerateResult) -> str:
        text = tok.decode(result.completion_token_ids, skip_special_tokens=True)
        if isinstance(result.stop_reason, str) and (at := text.find(result.stop_reason)) >= 0:
            text = text[:at]
        return text

    def _logprobs(ids: list[int], lps: list[float], tops: list[Any] | None) -> dict[str, Any]:
        content = []
        for j, (t, lp) in enumerate(zip(ids, lps, strict=True)):
            s = token_text(t)
            entry: dict[str, Any] = {
                "token": s,
                "logprob": lp,
                "bytes": list(s.encode()),
                "top_logprobs": [],
            }
            if tops is not None:
                entry["top_logprobs"] = [
                    {"token": (a := token_text(i)), "logprob": v, "bytes": list(a.encode())}
                    for i, v in tops[j]
                ]
            content.append(entry)
        return {"content": content}

    def _message(plan: _Plan, result: GenerateResult) -> tuple[dict[str, Any], str]:
        text = _text(result)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish: str = "stop" if result.finish_reason == "abort" else result.finish_reason
        if plan.parse_tools:
            parsed = parse_tool_calls(text)
            if parsed.malformed:
                log.info("malformed tool call kept as content: %.200r", text)
            message["content"] = parsed.content
            if parsed.tool_calls:
                message["tool_calls"] = parsed.tool_calls
                finish = "tool_calls"
        return message, finish

    def _response(plan: _Plan, results: list[GenerateResult]) -> dict[str, Any]:
        req = plan.req
        choices = []
        for i, r in enumerate(results):
            message, finish = _message(plan, r)
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "finish_reason": finish,
                "logprobs": None,
            }
            if req.logprobs:
                choice["logprobs"] = _logprobs(r.completion_token_ids, r.logprobs, r.top_logprobs)
            if req.return_token_ids:
                choice["token_ids"] = r.completion_token_ids
            choice["stop_reason"] = r.stop_reason
            choices.append(choice)
        completion_tokens = sum(len(r.completion_token_ids) for r in results)
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": plan.served.label,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(plan.prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(plan.prompt_ids) + completion_tokens,
            },
        }
        if req.return_token_ids:
            out["prompt_token_ids"] = plan.prompt_ids
        return out

    async def _stream(plan: _Plan) -> AsyncIterator[str]:
        req = plan.req
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        q: asyncio.Queue[tuple[int, TokenEvent | GenerateResult | BaseException]] = asyncio.Queue()

        share = asyncio.Semaphore(limits.max_parallel_choices)

        async def pump(i: int, s: SamplingParams) -> None:
            try:
                async with share:
                    async for item in engine.stream(plan.prompt_ids, s, plan.served.adapter):
                        await q.put((i, item))
            except BaseException as exc:  # delivered to the client as an error event
                await q.put((i, exc))

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            body = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": plan.served.label,
                "choices": choices,
                **extra,
            }
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(plan.samplings)]
        ids: list[list[int]] = [[] for _ in plan.samplings]
        sent_text = [0] * len(plan.samplings)
        holds = [ToolCallHoldback() for _ in plan.samplings]
        pending_ids: list[list[int]] = [[] for _ in plan.samplings]
        pending_lp: list[list[TokenEvent]] = [[] for _ in plan.samplings]
        usage_completion, open_ = 0, len(tasks)
        first = {"prompt_token_ids": plan.prompt_ids} if req.return_token_ids else {}
        try:
            yield chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                    for i in range(req.n)
                ],
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
                    yield f"data: {json.dumps({'error': {'message': msg, 'type': 'server_error', 'param': None, 'code': None}})}\n\n"
                    return
                if isinstance(item, TokenEvent):
                    ids[i].append(item.token_id)
                    pending_ids[i].append(item.token_id)
                    pending_lp[i].append(item)
                    text = tok.decode(ids[i], skip_special_tokens=True)
                    if text.endswith("\ufffd"):
                        continue  # an incomplete UTF-8 sequence: wait for the next token
                    new = holds[i].release(text) if plan.parse_tools else text[sent_text[i] :]
                    sent_text[i] = len(text)
                    if not new and not req.return_token_ids and not req.logprobs:
                        continue
                    delta: dict[str, Any] = {"content": new} if new else {}
                    ch: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": None}
                    if req.logprobs:
                        ch["logprobs"] = _logprobs(
                            [e.token_id for e in pending_lp[i]],
                            [e.logprob for e in pending_lp[i]],
                            [e.top for e in pending_lp[i]]
                            if pending_lp[i][0].top is not None
                            else None,
                        )
                    if req.return_token_ids:
                        ch["token_ids"] = pending_ids[i]
                    pending_ids[i], pending_lp[i] = [], []
                    yield chunk([ch])
                    continue
                # The finished result: flush what was held back.
                open_ -= 1
                usage_completion += len(item.completion_token_ids)
                message, finish = _message(plan, item)
                delta = {}
                if plan.parse_tools:
                    if message.get("tool_calls"):
                        delta["tool_calls"] = [
                            {"index": k, **tc} for k, tc in enumerate(message["tool_calls"])
                        ]
                    else:
                        full = message.get("content") or ""
                        rest = full[holds[i].sent :]
                        if rest:
                            delta["content"] = rest
                else:
                    full = _text(item)
                    already = sent_text[i]
                    # A stop string is cut from the text: never send past it.
                    if len(full) > already:
                        delta["content"] = full[already:]
                ch = {
                    "index": i,
                    "delta": delta,
                    "finish_reason": finish,
                    "stop_reason": item.stop_reason,
                }
                if req.return_token_ids and pending_ids[i]:
                    ch["token_ids"] = pending_ids[i]
                yield chunk([ch])
            if req.stream_options and req.stream_options.include_usage:
                n_prompt = len(plan.prompt_ids)
                usage = {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": usage_completion,
                    "total_tokens": n_prompt + usage_completion,
                }
                yield chunk([], usage=usage)
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()

    return app


def validation_message(errors: Any) -> str:
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


def _parse(raw: bytes, max_depth: int) -> ChatCompletionRequest:
    """Body bytes -> a validated request, or an _HTTPError 400 saying what is wrong."""
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise _HTTPError(
            400,
            f"the request body is nested deeper than {max_depth} levels",
            "invalid_request_error",
        ) from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity
        raise _HTTPError(
            400, "the request body is not valid JSON", "invalid_request_error"
        ) from None
    if not isinstance(body, dict):
        raise _HTTPError(400, "the request body must be a JSON object", "invalid_request_error")
    if problem := _check_json(body, max_depth):
        raise _HTTPError(400, problem, "invalid_request_error")
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise _HTTPError(400, validation_message(exc.errors()), "invalid_request_error") from None


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


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work`, but cancel it (and return None) if the client disconnects first: an
    abandoned request must not keep its batch slots. Event-driven: once the body is read,
    the server's next `receive()` message is the disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(request.receive())
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        log.info("client disconnected; cancelling its generation")
        return None
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t
