"""One inference replica in a child process: a `TorchEngine` behind our OpenAI server, with
the engine's own calls beside `/v1` so the parent's `ReplicaEngine` speaks token ids.

Routes added to the app of `serving/app.py` (`/v1/...`, `/health`, `/metrics` stay):

- `POST /engine/generate` {prompt_ids, sampling, adapter} -> a `GenerateResult`
- `POST /engine/stream` the same -> JSON lines, {"token": ...} per token, {"result": ...} last
- `POST /engine/load_adapter` {name, path} -> {"adapters": [...]}, after checking the
  engine lists `name` (the parent's verification); `POST /engine/unload_adapter` {name}
- `GET /engine/metrics` -> `EngineMetrics`

Errors are {"error": {"type": "usage" | "context_length" | "infrastructure", ...}} with
400 or 500, and `raise_wire_error` raises the same exception type in the parent.

The process dies with its parent: `--watch FD` is the read end of a pipe whose write end
only the parent holds; a thread reads it and exits the process on EOF, however the
parent ended. Once serving, it writes {port, pid, context_length, vocab_size} to
`--ready FILE` (atomically). Run by `ReplicaEngine`, not by hand:

    python -m art_langgraph.scaleout.replica_server --base PATH --ready FILE --watch FD \
        [--config JSON] [--threads N] [--name NAME]

Left out: a vLLM child (vLLM is its own server: `VLLMEngine` already is its client).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Request  # at module level: FastAPI resolves the routes' annotations here

from art_langgraph.engine.base import GenerateResult, SamplingParams, TokenEvent
from art_langgraph.errors import ContextLengthError, InfrastructureError, UsageError


# ----------------------------------------------------------------------- wire
def sampling_to_wire(s: SamplingParams) -> dict[str, Any]:
    return {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}


def sampling_from_wire(d: dict[str, Any]) -> SamplingParams:
    d = dict(d)
    for name in ("stop", "stop_token_ids"):
        d[name] = tuple(d.get(name) or ())
    return SamplingParams(**d)


def result_to_wire(r: GenerateResult) -> dict[str, Any]:
    return dataclasses.asdict(r)


def result_from_wire(d: dict[str, Any]) -> GenerateResult:
    d = dict(d)
    if d.get("top_logprobs") is not None:
        d["top_logprobs"] = [[(int(t), float(p)) for t, p in pos] for pos in d["top_logprobs"]]
    return GenerateResult(**d)


def event_from_wire(d: dict[str, Any]) -> TokenEvent:
    top = d.get("top")
    return TokenEvent(
        int(d["token_id"]),
        float(d["logprob"]),
        None if top is None else [(int(t), float(p)) for t, p in top],
    )


def error_to_wire(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) for an engine error."""
    if isinstance(exc, ContextLengthError):
        fields = {k: getattr(exc, k) for k in ("prompt_tokens", "max_tokens", "context_length")}
        return 400, {"error": {"type": "context_length", "message": str(exc), **fields}}
    if isinstance(exc, UsageError):
        return 400, {"error": {"type": "usage", "message": str(exc)}}
    return 500, {"error": {"type": "infrastructure", "message": f"{exc!r}"}}


def raise_wire_error(body: Any, where: str) -> None:
    """Raise the exception an error body describes (`where` names the replica)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        raise InfrastructureError(f"{where} answered {str(body)[:300]}")
    kind, message = err.get("type"), str(err.get("message"))
    if kind == "context_length":
        raise ContextLengthError(err["prompt_tokens"], err.get("max_tokens"), err["context_length"])
    if kind == "usage":
        raise UsageError(message)
    raise InfrastructureError(f"{where}: {message}")


# ---------------------------------------------------------------------- child
def _add_engine_routes(app: Any, engine: Any) -> None:
    from fastapi.responses import JSONResponse, StreamingResponse

    from art_langgraph.serving.app import unless_disconnected

    def fail(exc: BaseException) -> JSONResponse:
        status, body = error_to_wire(exc)
        return JSONResponse(status_code=status, content=body)

    def parse(body: dict[str, Any]) -> tuple[list[int], SamplingParams, str | None]:
        return list(body["prompt_ids"]), sampling_from_wire(body["sampling"]), body.get("adapter")

    @app.post("/engine/generate")
    async def generate(request: Request) -> Any:
        try:
            ids, sampling, adapter = parse(await request.json())
            result = await unless_disconnected(request, engine.generate(ids, sampling, adapter))
        except Exception as exc:
            return fail(exc)
        return None if result is None else result_to_wire(result)

    @app.post("/engine/stream")
    async def stream(request: Request) -> Any:
        try:
            ids, sampling, adapter = parse(await request.json())
        except Exception as exc:
            return fail(exc)

        async def lines() -> AsyncIterator[str]:
            try:
                async for item in engine.stream(ids, sampling, adapter):
                    if isinstance(item, TokenEvent):
                        yield json.dumps({"token": dataclasses.asdict(item)}) + "\n"
                    else:
                        yield json.dumps({"result": result_to_wire(item)}) + "\n"
            except Exception as exc:
                yield json.dumps(error_to_wire(exc)[1]) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/engine/load_adapter")
    async def load_adapter(request: Request) -> Any:
        try:
            body = await request.json()
            await engine.load_adapter(body["name"], body["path"])
            if body["name"] not in engine.list_adapters():
                raise InfrastructureError(
                    f"the engine does not list {body['name']!r} after loading"
                )
        except Exception as exc:
            return fail(exc)
        return {"adapters": engine.list_adapters()}

    @app.post("/engine/unload_adapter")
    async def unload_adapter(request: Request) -> Any:
        try:
            body = await request.json()
            if body["name"] in engine.list_adapters():
                await engine.unload_adapter(body["name"])
        except Exception as exc:
            return fail(exc)
        return {"adapters": engine.list_adapters()}

    @app.get("/engine/metrics")
    async def metrics() -> dict[str, Any]:
        return dataclasses.asdict(engine.metrics())


def _exit_when_orphaned(fd: int) -> None:
    """Read the parent's pipe until EOF (the parent is gone, however), then exit at once."""
    with contextlib.suppress(OSError):
        while os.read(fd, 64):
            pass
    os._exit(0)


def serve(
    base: str,
    config: dict[str, Any],
    threads: int,
    name: str = "base",
    host: str = "127.0.0.1",
    api_key: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Load a `TorchEngine` and serve it (the `/v1` app plus the engine routes) in a
    background thread; the server handle and {host, port, pid, context_length, vocab_size}.
    A `host` other than loopback needs `api_key` (it then guards `/engine` too)."""
    import torch

    from art_langgraph.engine.torch_engine import TorchEngine, TorchEngineConfig
    from art_langgraph.serving.app import create_app
    from art_langgraph.serving.registry import ModelRegistry
    from art_langgraph.serving.runner import start_app_server

    if threads > 0:
        torch.set_num_threads(threads)
    engine = TorchEngine.from_pretrained(base, TorchEngineConfig(**config))
    app = create_app(engine, ModelRegistry(name), api_key=api_key)
    _add_engine_routes(app, engine)
    handle = start_app_server(app, host=host, port=0, api_key=api_key)
    info = {
        "host": host,
        "port": handle.port,
        "pid": os.getpid(),
        "context_length": engine.context_length,
        "vocab_size": engine.vocab_size,
    }
    return handle, info


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="art_langgraph.scaleout.replica_server")
    ap.add_argument("--base", required=True, help="the base model's folder")
    ap.add_argument("--ready", required=True, help="where to write {port, ...} once serving")
    ap.add_argument("--watch", type=int, required=True, help="read end of the parent's pipe")
    ap.add_argument("--config", default="{}", help="TorchEngineConfig fields, as JSON")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--name", default="base", help="the served name on /v1")
    args = ap.parse_args(argv)
    threading.Thread(
        target=_exit_when_orphaned, args=(args.watch,), name="orphan-watch", daemon=True
    ).start()

    _, info = serve(args.base, json.loads(args.config), args.threads, args.name)
    ready = Path(args.ready)
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(ready)
    threading.Event().wait()  # serve until the parent goes (the watch thread exits us)


if __name__ == "__main__":
    main()
