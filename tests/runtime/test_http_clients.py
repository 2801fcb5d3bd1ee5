"""The shared HTTP clients (http_pool.py): aiohttp's pools under httpx, per event loop.

Errors keep httpx's own types (openai reports a refused connection or a server that hung
up as a connection error, not as "Request timed out"), and a loop's pool closes with
its loop without leaving an unclosed session behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import warnings
from collections.abc import Iterator

import httpx
import openai
import pytest

from art_langgraph.runtime.http_pool import async_http_client, shared_async_transport


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


@pytest.fixture
def slow_server() -> Iterator[int]:
    """Answers every chat completion with "ok", 1.5 s after the request arrives: a request
    that waited its turn in a busy engine's queue."""
    import json
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
        }
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(1.5)
            with contextlib.suppress(ConnectionError):  # the client that gave up has gone
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


async def test_the_chat_models_default_waits_for_a_slow_answer(slow_server: int) -> None:
    """`model.chat_model()` sets no deadline past connecting (CHAT_TIMEOUT): a long wait is
    answered, where a given timeout still holds."""
    from art_langgraph.tracing.chat_model import CHAT_TIMEOUT, build_chat_model

    url = f"http://127.0.0.1:{slow_server}/v1"
    chat = build_chat_model(name="m", step=None, base_url=url, api_key="k")
    assert chat.request_timeout is CHAT_TIMEOUT and CHAT_TIMEOUT.read is None
    assert (await chat.ainvoke("hi")).content == "ok"
    short = build_chat_model(
        name="m", step=None, base_url=url, api_key="k", max_retries=0, timeout=0.3
    )
    with pytest.raises(openai.APITimeoutError):
        await short.ainvoke("hi")


async def test_the_chat_models_default_fails_fast_on_a_dead_server(hang_up_server: int) -> None:
    """No deadline is no hang: a server that hangs up is a connection error at once."""
    from art_langgraph.tracing.chat_model import build_chat_model

    url = f"http://127.0.0.1:{hang_up_server}/v1"
    chat = build_chat_model(name="m", step=None, base_url=url, api_key="k", max_retries=0)
    with pytest.raises(openai.APIConnectionError) as info:
        await asyncio.wait_for(chat.ainvoke("hi"), 30)
    assert not isinstance(info.value, openai.APITimeoutError)
