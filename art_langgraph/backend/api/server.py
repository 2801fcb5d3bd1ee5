"""The backend server (`art-langgraph backend`): a `LocalBackend` behind HTTP, for `RemoteBackend`.

One port serves two APIs, in one process and one event loop:

- `/v1/...`, `/health` and `/metrics`: the OpenAI-compatible endpoint of the embedded
  backend (the same app as `LocalBackend`'s own server, `serving/app.py`), available once a
  model is registered (before: `/health` lists no models, the rest answer 503);
- `/art/v1/...`: the training API (`wire.py` has the bodies): `register`, `step`, `train`,
  `train_sft`, `log`, `delete_checkpoints`, `record_evaluation`, `health`.

A train call runs as a task of its own: a client that disconnects does not cancel the
step, and a retry with the same `Idempotency-Key` joins the running step or, once it is
committed, gets its result back (`LocalBackend` finds the id in the checkpoint's marker).
A backend killed mid-step has committed nothing (steps are all or nothing), so the retry
trains it once.

Security as for `serve`: 127.0.0.1 by default, a non-loopback bind needs an API key, and
the key guards `/v1`, `/art` and `/metrics`. Bodies are bounded compressed
(`max_upload_bytes`) and decompressed (`max_decoded_bytes`); malformed ones get 400 and
nothing is written.

Left out: TLS (put a reverse proxy in front), several base models per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from art_langgraph.backend.api.wire import (
    IDEMPOTENCY_HEADER,
    PREFIX,
    BodyTooLarge,
    DeleteRequest,
    EvaluationRequest,
    LogRequest,
    ModelSpec,
    SFTRequest,
    StepEvent,
    TrainRequest,
    check_idempotency_key,
    decode_body,
)
from art_langgraph.backend.base import TrainResult
from art_langgraph.backend.choices import EngineChoice, ServerChoice, TrainerChoice
from art_langgraph.backend.local import LocalBackend
from art_langgraph.errors import ArtError, NotRegisteredError, UsageError
from art_langgraph.serving.chat_service import validation_message
from art_langgraph.serving.config import ServerConfig
from art_langgraph.serving.guard import Guard, error_json
from art_langgraph.trajectories.plain import plain

log = logging.getLogger(__name__)


class BackendServerConfig(BaseModel):
    """Limits of the training API (the OpenAI endpoint's are `ServerConfig`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_upload_bytes: int = Field(64 * 2**20, ge=1024)
    """Largest request body as sent (gzip-compressed or not): 413 above it, before reading."""
    max_decoded_bytes: int = Field(256 * 2**20, ge=1024)
    """Largest request body once decompressed: 413 above it (a gzip bomb is never expanded
    past it). 256 MiB holds a step of about 10M tokens of trajectories."""
    heartbeat_s: float = Field(5.0, gt=0)
    """A train call's stream sends a heartbeat line this often while the step runs, so
    proxies and the client see a live connection."""


@dataclass
class _Job:
    """One running train call, shared by the requests that carry its id."""

    task: asyncio.Task[TrainResult]
    listeners: list[asyncio.Queue[StepEvent]] = field(default_factory=list)


class _TrainingAPI:
    def __init__(self, backend: LocalBackend, config: BackendServerConfig) -> None:
        self.backend, self.config = backend, config
        self.models: dict[str, Any] = {}
        self.jobs: dict[str, _Job] = {}
        self.register_lock = asyncio.Lock()

    # ----------------------------------------------------------------- helpers
    async def body(self, request: Request, kind: type[BaseModel]) -> Any:
        raw = await request.body()  # the Guard bounds the compressed size

        def parse() -> Any:
            data = decode_body(
                raw, request.headers.get("content-encoding"), self.config.max_decoded_bytes
            )
            try:
                return kind.model_validate_json(data)
            except ValidationError as exc:
                raise UsageError(validation_message(exc.errors())) from None

        return await asyncio.to_thread(parse)  # large groups: off the event loop

    def model(self, spec: ModelSpec) -> Any:
        model = self.models.get(spec.name)
        if model is None or ModelSpec.of(model) != spec:
            raise NotRegisteredError(
                f"model {spec.name!r} is not registered with this backend (or was registered "
                "with other settings): await model.register(backend) first"
            )
        return model

    # ------------------------------------------------------------------ routes
    async def health(self, _: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "base_model": self.backend.base_model,
                "models": {
                    name: (await self.backend.get_step(m)) for name, m in self.models.items()
                },
            }
        )

    async def register(self, request: Request) -> JSONResponse:
        spec: ModelSpec = await self.body(request, ModelSpec)
        async with self.register_lock:
            current = self.models.get(spec.name)
            if current is None or ModelSpec.of(current) != spec:
                model = spec.build()
                await self.backend.register(model)
                self.models[spec.name] = model
            step = await self.backend.get_step(self.models[spec.name])
        return JSONResponse({"step": step})

    async def step(self, request: Request) -> JSONResponse:
        spec: ModelSpec = await self.body(request, ModelSpec)
        return JSONResponse({"step": await self.backend.get_step(self.model(spec))})

    async def log_(self, request: Request) -> JSONResponse:
        req: LogRequest = await self.body(request, LogRequest)
        await self.backend.log(self.model(req.model), list(req.groups), req.split)
        return JSONResponse({"ok": True})

    async def delete(self, request: Request) -> JSONResponse:
        req: DeleteRequest = await self.body(request, DeleteRequest)
        deleted = await self.backend.delete_checkpoints(
            self.model(req.model), req.metric, req.keep_last
        )
        return JSONResponse({"deleted": deleted})

    async def evaluation(self, request: Request) -> JSONResponse:
        req: EvaluationRequest = await self.body(request, EvaluationRequest)
        decision = await self.backend.record_evaluation(
            self.trainable(req.model), req.step, req.score
        )
        return JSONResponse(decision.model_dump())

    def trainable(self, spec: ModelSpec) -> Any:
        model = self.model(spec)
        if not model.trainable:
            raise UsageError(f"model {model.name!r} is not trainable")
        return model

    async def train(self, request: Request) -> StreamingResponse:
        key = check_idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
        req: TrainRequest = await self.body(request, TrainRequest)
        model = self.trainable(req.model)
        return self.stream(
            key,
            lambda progress: self.backend.train(
                model, list(req.groups), req.config, progress, request_id=key
            ),
        )

    async def train_sft(self, request: Request) -> StreamingResponse:
        key = check_idempotency_key(request.headers.get(IDEMPOTENCY_HEADER))
        req: SFTRequest = await self.body(request, SFTRequest)
        model = self.trainable(req.model)
        items = [item.value() for item in req.items]
        return self.stream(
            key,
            lambda _: self.backend.train_sft(
                model,
                items,
                req.config,
                req.epochs,
                req.batch_size,
                stop_loss=req.stop_loss,
                request_id=key,
            ),
        )

    # --------------------------------------------------------------- streaming
    def stream(
        self, request_id: str, start: Callable[[Any], Awaitable[TrainResult]]
    ) -> StreamingResponse:
        """Join the running job with this id, or start one; answer its events as JSON lines."""
        job = self.jobs.get(request_id)
        if job is None:
            loop = asyncio.get_running_loop()
            listeners: list[asyncio.Queue[StepEvent]] = []

            def progress(stage: str, data: dict[str, Any]) -> None:  # the trainer's thread
                event = StepEvent(type="progress", stage=stage, data=plain(data))
                for q in list(listeners):
                    with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                        loop.call_soon_threadsafe(q.put_nowait, event)

            job = _Job(asyncio.ensure_future(start(progress)), listeners)
            self.jobs[request_id] = job

            def finished(task: asyncio.Task[TrainResult]) -> None:
                self.jobs.pop(request_id, None)
                if not task.cancelled() and task.exception() is not None and not job.listeners:
                    log.warning(
                        "train request %s failed with nobody listening: %s",
                        request_id,
                        task.exception(),
                    )

            job.task.add_done_callback(finished)
        queue: asyncio.Queue[StepEvent] = asyncio.Queue()
        job.listeners.append(queue)
        return StreamingResponse(
            self.events(request_id, job, queue), media_type="application/x-ndjson"
        )

    async def events(
        self, request_id: str, job: _Job, queue: asyncio.Queue[StepEvent]
    ) -> AsyncIterator[str]:
        try:
            yield _line(StepEvent(type="accepted", data={"request_id": request_id}))
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, job.task},
                    timeout=self.config.heartbeat_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getter in done:
                    yield _line(getter.result())
                    continue
                getter.cancel()
                if job.task in done:
                    break
                yield _line(StepEvent(type="heartbeat"))
            while not queue.empty():
                yield _line(queue.get_nowait())
            exc = job.task.exception()
            if exc is None:
                result = job.task.result()
                yield _line(StepEvent(type="result", data=result.model_dump()))
            else:
                yield _line(_error_event(exc))
        finally:
            # The job goes on without this listener (a client that left retries by id).
            with contextlib.suppress(ValueError):
                job.listeners.remove(queue)


def _error_event(exc: BaseException) -> StepEvent:
    if not isinstance(exc, ArtError):
        log.error("train step failed", exc_info=exc)
    kind = type(exc).__name__ if isinstance(exc, ArtError) else "InfrastructureError"
    return StepEvent(type="error", data={"message": str(exc) or repr(exc), "kind": kind})


def _line(event: StepEvent) -> str:
    return event.model_dump_json(exclude_defaults=False) + "\n"


def _error_status(exc: BaseException) -> int:
    if isinstance(exc, BodyTooLarge):
        return 413
    if isinstance(exc, NotRegisteredError):
        return 404
    if isinstance(exc, UsageError):
        return 400
    return 500


def create_backend_app(
    backend: LocalBackend,
    *,
    api_key: str | None = None,
    config: BackendServerConfig | None = None,
) -> Any:
    """The ASGI app of the backend server (run it with uvicorn; `serve_backend` does)."""
    if api_key is not None and not api_key.strip():
        raise UsageError("the API key is empty or whitespace: pass a real key, or none")
    limits = config or BackendServerConfig()
    api = _TrainingAPI(backend, limits)

    def route(path: str, fn: Callable[[Request], Awaitable[Any]], method: str) -> Route:
        async def endpoint(request: Request) -> Any:
            try:
                return await fn(request)
            except (ArtError, ValueError) as exc:
                status = _error_status(exc)
                if status == 500:
                    log.error("%s failed", path, exc_info=exc)
                return JSONResponse(
                    {"error": {"message": str(exc), "type": type(exc).__name__}},
                    status_code=status,
                )

        return Route(PREFIX + path, endpoint, methods=[method])

    art = Starlette(
        routes=[
            route("/health", api.health, "GET"),
            route("/register", api.register, "POST"),
            route("/step", api.step, "POST"),
            route("/train", api.train, "POST"),
            route("/train_sft", api.train_sft, "POST"),
            route("/log", api.log_, "POST"),
            route("/delete_checkpoints", api.delete, "POST"),
            route("/record_evaluation", api.evaluation, "POST"),
        ]
    )
    guarded_art = Guard(art, api_key=api_key, max_body_bytes=limits.max_upload_bytes)

    async def not_ready(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("path", "") == "/health":
            await _answer(send, 200, json.dumps({"status": "ok", "models": []}).encode())
        else:
            message = "no model is registered yet: the OpenAI endpoint starts with the first"
            await _answer(send, 503, error_json(message, "server_error"))

    # The key is checked before a client learns whether a model is registered.
    guarded_not_ready = Guard(not_ready, api_key=api_key, max_body_bytes=limits.max_upload_bytes)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return
        if scope.get("path", "").startswith("/art/"):
            await guarded_art(scope, receive, send)
        elif backend.app is not None:
            await backend.app(scope, receive, send)
        else:
            await guarded_not_ready(scope, receive, send)

    return app


async def _answer(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def serve_backend(
    path: str | Path = ".art",
    *,
    host: str = "127.0.0.1",
    port: int = 8090,
    api_key: str | None = None,
    log_level: str = "info",
    server_config: ServerConfig | None = None,
    config: BackendServerConfig | None = None,
    engine_config: Any = None,
    device: str | None = None,
    engine: Literal["auto", "torch", "vllm"] = "auto",
    trainer_ranks: int = 1,
    replicas: int = 1,
    ray: str | None = None,
    trainer_fsdp: bool | None = None,
) -> None:
    """Serve the training API and the OpenAI endpoint in the foreground until SIGINT/SIGTERM.
    `replicas`, `trainer_ranks`, `ray`, `trainer_fsdp`: as `LocalBackend`'s."""
    import uvicorn

    from art_langgraph.serving.runner import check_bind, uvicorn_config

    check_bind(host, api_key)
    limits = server_config or ServerConfig()
    backend = LocalBackend(
        path,
        engine=EngineChoice(engine, replicas, ray, device, engine_config),
        trainer=TrainerChoice(trainer_ranks, trainer_fsdp),
        server=ServerChoice(host, api_key=api_key, http=False),  # the app is mounted below
        server_config=limits,
    )
    app = create_backend_app(backend, api_key=api_key, config=config)
    server = uvicorn.Server(uvicorn_config(app, host, port, log_level, limits, access_log=False))

    async def main() -> None:
        try:
            await server.serve()
        finally:
            await backend.close()

    asyncio.run(main())
