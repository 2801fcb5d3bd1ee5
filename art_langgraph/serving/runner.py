"""Start the OpenAI-compatible server: in a background thread (Python) or in the foreground (CLI).

`start_server(engine, registry, ...)` binds, waits until the server answers, and
returns a `ServerHandle` with the `base_url`; `handle.stop()` shuts it down. Port 0
picks a free port (the handle reports the one bound). `serve(base_model=...)` builds
an engine and serves it until interrupted, which is what `art-langgraph serve` runs.

Security: the host defaults to 127.0.0.1, and binding any non-loopback address
without an API key is refused. Limits and timeouts come from `ServerConfig`.

Left out: TLS and multi-process workers (one engine owns the model).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn

from art_langgraph.engine.base import InferenceEngine
from art_langgraph.errors import InfrastructureError, UsageError
from art_langgraph.serving.app import create_app
from art_langgraph.serving.config import ServerConfig
from art_langgraph.serving.registry import ModelRegistry


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse a non-loopback bind without an API key."""
    if not _is_loopback(host) and not api_key:
        raise UsageError(
            f"refusing to bind {host!r} without an API key: anyone on the network could use the "
            "model; pass api_key (--api-key) or bind 127.0.0.1"
        )


@dataclass
class ServerHandle:
    """A running server. `stop()` is idempotent."""

    host: str
    port: int
    api_key: str | None
    _server: uvicorn.Server
    _thread: threading.Thread

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. http://127.0.0.1:8000/v1."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def uvicorn_config(
    app: Any, host: str, port: int, log_level: str, limits: ServerConfig, access_log: bool = False
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        lifespan="off",
        timeout_keep_alive=max(1, round(limits.keep_alive_s)),
        timeout_graceful_shutdown=max(0, round(limits.graceful_shutdown_s)),
    )


def start_server(
    engine: InferenceEngine,
    registry: ModelRegistry,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    log_level: str = "warning",
    startup_timeout_s: float = 30.0,
    config: ServerConfig | None = None,
) -> ServerHandle:
    """Serve `engine` in a background thread; returns once the port is bound."""
    app = create_app(engine, registry, api_key=api_key, config=config)
    return start_app_server(
        app,
        host=host,
        port=port,
        api_key=api_key,
        log_level=log_level,
        startup_timeout_s=startup_timeout_s,
        config=config,
    )


def start_app_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    log_level: str = "warning",
    startup_timeout_s: float = 30.0,
    config: ServerConfig | None = None,
) -> ServerHandle:
    """Serve an ASGI app made by `create_app` (which holds the key) in a background thread."""
    check_bind(host, api_key)
    limits = config or ServerConfig()
    server = uvicorn.Server(uvicorn_config(app, host, port, log_level, limits))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.serve())
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)

    thread = threading.Thread(target=run, name="art-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if errors or not thread.is_alive():
            raise InfrastructureError(
                f"the server did not start on {host}:{port}: {errors[:1] or 'exited'}"
            )
        if time.monotonic() > deadline:
            server.should_exit = True
            raise InfrastructureError(f"the server did not start within {startup_timeout_s} s")
        time.sleep(0.01)
    sock: socket.socket = server.servers[0].sockets[0]
    bound_port = int(sock.getsockname()[1])
    return ServerHandle(host, bound_port, api_key, server, thread)


def serve(
    base_model: str = "tiny",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_name: str | None = None,
    chat_template: str | None = None,
    log_level: str = "info",
    config: ServerConfig | None = None,
) -> None:
    """Build a torch engine for `base_model` and serve it in the foreground until Ctrl-C or
    SIGTERM (running requests get `graceful_shutdown_s`, then are cancelled)."""
    from art_langgraph.engine.torch_engine import TorchEngine, TorchEngineConfig

    check_bind(host, api_key)
    limits = config or ServerConfig()
    engine = TorchEngine.from_pretrained(base_model, TorchEngineConfig(chat_template=chat_template))
    try:
        registry = ModelRegistry(served_name or base_model)
        app = create_app(engine, registry, api_key=api_key, config=limits)
        uvicorn.Server(uvicorn_config(app, host, port, log_level, limits, access_log=True)).run()
    finally:
        engine.close_sync()
