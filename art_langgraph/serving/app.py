"""The OpenAI-compatible HTTP server around an `InferenceEngine` (FastAPI): the routes.

Endpoints: `GET /health`, `GET /v1/models`, `GET /metrics` (Prometheus text, as vLLM's:
`metrics.py`), `POST /v1/chat/completions` (messages, tools and tool_choice, sampling, n,
stop, seed, logprobs, response_format with JSON schemas, SSE streaming; usage with
`prompt_tokens_details.cached_tokens`, as OpenAI's), `POST /v1/responses` (OpenAI's
Responses API, as vLLM serves it, translated onto the same chat-completions path:
`responses.py`; what it refuses is a 400 naming the parameter). With `"return_token_ids": true` a
response carries `prompt_token_ids` (top level) and `token_ids` per choice, as vLLM
names them; with `"return_token_logprobs": true` (ours), `token_logprobs` per choice,
one float per completion token. The response's `model` is `name@step` for the weights
that answered.

The routes move bytes: the OpenAI translation (request -> plan -> typed response) is
`ChatService` (`chat_service.py`). Here: the `Guard` (keys, sizes, content types),
parsing and planning on one worker thread (never on the event loop), waiting while the
model's step trains, and cancelling the rows of a client that left.

Errors are OpenAI-style JSON bodies: 400 for malformed input (a prompt too long for the
context names both lengths), 401 for a wrong or missing API key, 404 for an unknown
model or an endpoint not served (its message lists the ones served; 405 likewise for a
wrong method), 500 when the engine fails. The key guards `/metrics` as it guards `/v1/models`
(the Guard).

The routes reach the engine and the services through the request's app
(`app.state.served`, `_Served`), never through a closure: FastAPI keeps endpoint
functions in module-level caches, and a closure would keep a stopped server's engine.

Left out: the legacy `/v1/completions`, embeddings, stored responses (`GET
/v1/responses/{id}` and the like are 404s), and adapter management over HTTP (the
backend loads adapters in-process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from art_langgraph.engine.base import InferenceEngine
from art_langgraph.errors import UsageError
from art_langgraph.serving.chat_protocol import ChatCompletionRequest
from art_langgraph.serving.chat_service import ChatService, Plan, ServiceError, validation_message
from art_langgraph.serving.config import ServerConfig
from art_langgraph.serving.guard import Guard
from art_langgraph.serving.metrics import CONTENT_TYPE, ServerMetrics
from art_langgraph.serving.registry import ModelRegistry
from art_langgraph.serving.responses import ResponsesService
from art_langgraph.serving.responses_protocol import ResponsesRequest

log = logging.getLogger(__name__)


def _error(exc: ServiceError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content=exc.body())


def create_app(
    engine: InferenceEngine,
    registry: ModelRegistry,
    *,
    api_key: str | None = None,
    config: ServerConfig | None = None,
) -> FastAPI:
    """The FastAPI app; run it with uvicorn (see `serving/runner.py`)."""
    if api_key is not None and not api_key.strip():
        raise UsageError("the API key is empty or whitespace: pass a real key, or none")
    limits = config or ServerConfig()
    app = FastAPI(title="art_langgraph", docs_url=None, redoc_url=None)
    app.state.served = _Served(engine, registry, limits)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=limits.max_body_bytes)

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(ServiceError(400, validation_message(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _starlette(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = f"Invalid URL ({where}): this server serves {_endpoints(request.app)}"
            return _error(ServiceError(404, message))
        if exc.status_code == 405:
            message = f"Method not allowed ({where}): this server serves {_endpoints(request.app)}"
            return _error(ServiceError(405, message))
        return _error(ServiceError(exc.status_code, str(exc.detail)))

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        s = _served_by(request)
        return {"status": "ok", "models": s.registry.labels(), "adapters": s.engine.list_adapters()}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        registry = _served_by(request).registry
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "art_langgraph"}
            for name in [*registry.names(), *registry.labels()]
        ]
        return {"object": "list", "data": data}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(_served_by(request).exposition.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        s = _served_by(request)
        service = s.service
        raw = await request.body()  # the Guard bounds its size
        # One trip to the worker for both when the model is not training (the common case);
        # otherwise the plan waits for the new step, which it must resolve to.
        req, plan = await s.off_loop(s.parse_and_plan, raw)
        if (plan := await s.ready_plan(request, req, plan)) is None:
            return None
        if req.stream:
            return StreamingResponse(service.stream(plan), media_type="text/event-stream")
        results = await unless_disconnected(request, service.generate(plan))
        if results is None:
            return None  # the client left: its rows were cancelled, nobody reads an answer
        body = service.response(plan, results).model_dump_json()
        return Response(body, media_type="application/json")

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Any:
        s = _served_by(request)
        service, responses = s.service, s.responses
        raw = await request.body()
        rreq, req, plan = await s.off_loop(s.parse_and_plan_responses, raw)
        if (plan := await s.ready_plan(request, req, plan)) is None:
            return None
        if rreq.stream:
            return StreamingResponse(responses.stream(rreq, plan), media_type="text/event-stream")
        results = await unless_disconnected(request, service.generate(plan))
        if results is None:
            return None
        body = responses.response(rreq, plan, results).model_dump_json()
        return Response(body, media_type="application/json")

    return app


class _Served:
    """What an app's routes serve, held by the app alone (`app.state.served`): the routes
    reach it through their request (`_served_by`), never through a closure. FastAPI
    (0.165) keeps every endpoint function it has classified in module-level caches of 4096
    entries, so a closure over the engine would keep a stopped server's engine, weights
    and caches (1.5 GiB for SmolLM2-135M) alive for the rest of the process."""

    def __init__(self, engine: InferenceEngine, registry: ModelRegistry, limits: ServerConfig):
        self.engine = engine
        self.registry = registry
        self.service = ChatService(engine, registry, limits)
        self.responses = ResponsesService(self.service)
        self.exposition = ServerMetrics(engine, registry.base_name)
        # Parsing, validation, chat templates and tokenization run here, one request at a
        # time, never on the event loop: a large prompt must not stall /health or others.
        self.cpu = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-render")

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.cpu, fn, *args)

    def parse_and_plan(self, raw: bytes) -> tuple[ChatCompletionRequest, Plan | None]:
        req = self.service.parse(raw)
        return req, None if self.registry.is_paused(req.model) else self.service.plan(req)

    def parse_and_plan_responses(
        self, raw: bytes
    ) -> tuple[ResponsesRequest, ChatCompletionRequest, Plan | None]:
        rreq, req = self.responses.parse(raw)
        return rreq, req, None if self.registry.is_paused(req.model) else self.service.plan(req)

    async def ready_plan(
        self, request: Request, req: ChatCompletionRequest, plan: Plan | None
    ) -> Any:
        """The plan, once the model is not training (None if the client left meanwhile)."""
        if plan is None:
            while self.registry.is_paused(req.model):  # a step is training: wait (ART's)
                if await request.is_disconnected():
                    return None
                await asyncio.sleep(0.005)
            plan = await self.off_loop(self.service.plan, req)
        await self.service.ensure_adapter(plan)
        return plan


def _served_by(request: Request) -> _Served:
    served: _Served = request.app.state.served
    return served


def _endpoints(app: FastAPI) -> str:
    """The endpoints `app` serves, as 'GET /health, POST /v1/responses, ...'."""
    routes = []
    for route in app.routes:
        methods = sorted(getattr(route, "methods", None) or ())
        path = getattr(route, "path", "")
        routes += [f"{m} {path}" for m in methods if m != "HEAD"]
    return ", ".join(routes)


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
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
