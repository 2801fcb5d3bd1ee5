"""The shared HTTP clients (http_pool.py): aiohttp's pools under httpx, per event loop.

Errors keep httpx's own types (openai reports a refused connection or a server that hung
up as a connection error, not as "Request timed out"), and a loop's pool closes with
its loop without leaving an unclosed session behind.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import warnings
from collections.abc import Iterator

import httpx
import openai
import pytest

from art_langgraph.http_pool import async_http_client, shared_async_transport


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def hang_up_server() -> Iterator[int]:
    """Accepts connections, reads the request, and closes without answering."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    srv.close()


def _client(port: int) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="k",
        max_retries=0,
        http_client=async_http_client(),
    )


async def test_a_refused_connection_is_a_connection_error() -> None:
    with pytest.raises(openai.APIConnectionError) as info:
        await _client(_closed_port()).models.list()
    assert not isinstance(info.value, openai.APITimeoutError)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


async def test_a_server_that_hangs_up_is_a_connection_error(hang_up_server: int) -> None:
    with pytest.raises(openai.APIConnectionError) as info:
        await _client(hang_up_server).models.list()
    assert not isinstance(info.value, openai.APITimeoutError)
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)


def test_a_loops_pool_closes_with_its_loop(hang_up_server: int) -> None:
    transport = shared_async_transport()

    async def use() -> object:
        with pytest.raises(openai.APIConnectionError):
            await _client(hang_up_server).models.list()
        return transport._pool()  # type: ignore[attr-defined]

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        pool = asyncio.run(use())
        assert pool.session.closed  # type: ignore[attr-defined]
        gc.collect()
