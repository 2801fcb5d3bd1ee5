"""The HTTP connection pools every client of our servers shares: `async_http_client()`,
`sync_http_client()` and `shared_async_transport()`.

The chat model, `model.openai_client()` and `RemoteBackend` all talk to an
OpenAI-compatible server or the training API over these, so the pools live here, below
all three, rather than with one of them.

Left out: retries and timeouts (each client sets its own).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx

from art_langgraph.runtime.event_loops import PerLoop

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


def with_json_body(request: httpx.Request, body: dict[str, Any]) -> httpx.Request:
    """`request` with `body` as its JSON content: its method, URL, headers (but its old
    Content-Length) and extensions kept; for a transport that rewrites a request on its way."""
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        content=json.dumps(body).encode(),
        extensions=request.extensions,
    )
