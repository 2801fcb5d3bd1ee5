"""The server against careless and hostile clients: abandoned requests, one request that
wants the whole engine, oversized and malformed bodies, foreign Host headers, SIGTERM.

Every test here failed before its fix. None asserts a timing: where a test must wait,
it waits for an event and bounds the wait only to catch a hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from art_langgraph.engine import TorchEngine
from art_langgraph.errors import UsageError
from art_langgraph.serving import ModelRegistry, ServerConfig, ServerHandle, start_server

ROOT = Path(__file__).resolve().parents[2]
USER = [{"role": "user", "content": "Count to ten."}]
OK = {"model": "tiny", "messages": USER, "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def small(engine: TorchEngine) -> Iterator[ServerHandle]:
    """The shared tiny engine behind a server with small limits."""
    cfg = ServerConfig(max_body_bytes=64 * 1024, default_max_tokens=12, max_request_tokens=40_000)
    with start_server(engine, ModelRegistry("tiny"), config=cfg) as handle:
        yield handle


async def _wait_idle(engine: TorchEngine, bound_s: float = 120) -> None:
    deadline = time.monotonic() + bound_s
    while engine.active or not engine._inbox.empty():
        assert time.monotonic() < deadline, "the engine never drained"
        await asyncio.sleep(0.02)


async def test_an_abandoned_request_is_cancelled_and_frees_its_rows(
    engine: TorchEngine, small: ServerHandle
) -> None:
    await _wait_idle(engine)
    body = {**OK, "n": 8, "max_tokens": 4000, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=600) as http:
        assert (await http.post(f"{small.base_url}/chat/completions", json=OK)).status_code == 200
        before = engine.steps
        abandoned = asyncio.create_task(http.post(f"{small.base_url}/chat/completions", json=body))
        while engine.active < 8:  # all its rows are decoding
            await asyncio.sleep(0.01)
        abandoned.cancel()  # the client gives up: httpx drops the connection
        with pytest.raises(asyncio.CancelledError):
            await abandoned
    await _wait_idle(engine)
    # Rows that ran to max_tokens would have taken 4000 decode steps; cancelled, far fewer.
    assert engine.steps - before < 2000


async def test_one_request_cannot_take_every_batch_slot(
    engine: TorchEngine, small: ServerHandle
) -> None:
    await _wait_idle(engine)
    big = {**OK, "n": 64, "max_tokens": 600, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=600) as http:
        hog = asyncio.create_task(http.post(f"{small.base_url}/chat/completions", json=big))
        while not engine.active:
            await asyncio.sleep(0.01)
        small_reply = await http.post(f"{small.base_url}/chat/completions", json=OK)
        assert small_reply.status_code == 200
        assert not hog.done()  # served beside the 64-choice request, not after it
        assert (await hog).status_code == 200
    assert engine.config.max_batch_size == 64  # the whole batch, had the hog been let in


async def test_request_wide_token_bound_and_a_small_default_max_tokens(
    small: ServerHandle,
) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(
            f"{small.base_url}/chat/completions", json={**OK, "n": 64, "max_tokens": 4000}
        )
        assert r.status_code == 400 and "n x max_tokens" in r.json()["error"]["message"]
        body = {"model": "tiny", "messages": USER, "ignore_eos": True, "return_token_ids": True}
        r = await http.post(f"{small.base_url}/chat/completions", json=body)
        assert r.status_code == 200
        (choice,) = r.json()["choices"]
        assert len(choice["token_ids"]) == 12 and choice["finish_reason"] == "length"


async def test_oversized_bodies_get_413_before_parsing(small: ServerHandle) -> None:
    big = {**OK, "messages": [{"role": "user", "content": "x" * 100_000}]}
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{small.base_url}/chat/completions", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        async def chunks():  # no Content-Length: counted as it arrives
            yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
            for _ in range(40):
                yield b"y" * 4096
            yield b'"}]}'

        r = await http.post(
            f"{small.base_url}/chat/completions",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413
    async with httpx.AsyncClient(timeout=60) as http:
        assert (await http.post(f"{small.base_url}/chat/completions", json=OK)).status_code == 200


async def test_rendering_a_large_prompt_does_not_block_health(server: ServerHandle) -> None:
    """A 3 MB prompt is parsed and tokenized off the event loop: /health answers meanwhile."""
    words = " ".join(f"word{i}" for i in range(300_000))
    big = {**OK, "messages": [{"role": "user", "content": words}]}
    async with httpx.AsyncClient(timeout=300) as http:
        slow = asyncio.create_task(http.post(f"{server.base_url}/chat/completions", json=big))
        await asyncio.sleep(0.2)  # the body is uploaded and rendering has begun
        health = await http.get(server.base_url.removesuffix("/v1") + "/health")
        assert health.status_code == 200
        assert not slow.done()
        r = await slow
        assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]


LONE_SURROGATE = (
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": '
    b'[{"type": "function", "function": {"name": "f\\ud800"}}], "max_tokens": 2}'
)
MALFORMED = [
    {**OK, "messages": [{"role": "assistant", "content": "x", "tool_calls": True}, *USER]},
    {
        **OK,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": ["a", "b"]},
                },
            }
        ],
    },
    {**OK, "seed": 2**64},
    {**OK, "seed": -(2**64)},
    {**OK, "tool_choice": {"type": "function", "function": "f"}},
    {**OK, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": 7},
    {**OK, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
    {**OK, "structured_outputs": {"choice": "abc"}},
    {**OK, "stop": ["x" * 1000]},
    {**OK, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
]


def _raw_post(http: httpx.Client, url: str, raw: bytes) -> httpx.Response:
    return http.post(url, content=raw, headers={"content-type": "application/json"})


def _assert_openai_error(r: httpx.Response, status: int = 400) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["type"] == "invalid_request_error"


def test_named_malformed_requests_get_400_and_the_connection_survives(
    small: ServerHandle,
) -> None:
    url = f"{small.base_url}/chat/completions"
    nested = b'{"model": "tiny", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    with httpx.Client(timeout=60) as http:  # one keep-alive connection for all
        for body in MALFORMED:
            _assert_openai_error(http.post(url, json=body))
            assert http.post(url, json=OK).status_code == 200
        for raw in (LONE_SURROGATE, nested, b'{"model": "tiny", "temperature": NaN}'):
            _assert_openai_error(_raw_post(http, url, raw))
            assert http.post(url, json=OK).status_code == 200


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = [
    "messages", "tools", "tool_choice", "n", "max_tokens", "temperature", "top_p", "seed",
    "stop", "logprobs", "top_logprobs", "response_format", "structured_outputs", "model",
    "stream", "parallel_tool_calls", "return_token_ids",
]  # fmt: skip
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@st.composite
def _mutated(draw: st.DrawFn) -> dict:
    """A valid request with 1-3 fields (or nested parts of messages/tools) replaced."""
    body: dict = {**OK, "tools": [json.loads(json.dumps(_TOOL))]}
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from([*_FIELDS, "message", "tool_function", "tool_params"]))
        value = draw(_json)
        if where == "message":
            body["messages"] = [{**USER[0], draw(st.sampled_from(["role", "content", "tool_calls", "name"])): value}]  # fmt: skip
        elif where == "tool_function":
            body["tools"] = [{"type": "function", "function": value}]
        elif where == "tool_params":
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": value}}]
        else:
            body[where] = value
    return body


def test_generated_malformed_requests_never_get_a_500(small: ServerHandle) -> None:
    url = f"{small.base_url}/chat/completions"
    with httpx.Client(timeout=120) as http:

        @settings(
            max_examples=150,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(_mutated())
        def check(body: dict) -> None:
            r = http.post(url, json=body)
            assert r.status_code in (200, 400, 404), (r.status_code, r.text[:300], body)
            if r.status_code != 200:
                _assert_openai_error(r, r.status_code)
            assert http.post(url, json=OK).status_code == 200  # same connection, still fine

        check()


def test_auth_and_host_rules(engine: TorchEngine, small: ServerHandle) -> None:
    with pytest.raises(UsageError, match="whitespace"):
        start_server(engine, ModelRegistry("tiny"), api_key="   ")
    url = f"{small.base_url}/chat/completions"
    with httpx.Client(timeout=60) as http:
        r = http.post(url, content=json.dumps(OK), headers={"content-type": "text/plain"})
        assert r.status_code == 415  # what a browser may send cross-origin without asking
        r = http.post(url, json=OK, headers={"host": "evil.example:80"})
        assert r.status_code == 421  # DNS rebinding: a foreign name pointing at 127.0.0.1
        assert http.post(url, json=OK, headers={"host": "localhost:1"}).status_code == 200
    keyed = start_server(engine, ModelRegistry("tiny"), api_key="sk-test")
    with keyed, httpx.Client(timeout=60) as http:
        keyed_url = f"{keyed.base_url}/chat/completions"
        for header in ("bearer sk-test", "Bearer  sk-test", "BEARER sk-test"):
            r = http.post(keyed_url, json=OK, headers={"authorization": header})
            assert r.status_code == 200, header
        for header in ("Bearer sk-tes", "Basic sk-test", "sk-test", ""):
            r = http.post(keyed_url, json=OK, headers={"authorization": header})
            assert r.status_code == 401, header


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_cli_server_keeps_connections_alive_and_stops_on_sigterm_despite_a_stuck_client(
    tmp_path: Path,
) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "art_langgraph.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server never started"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        with httpx.Client(timeout=60) as http:  # one connection, idle past the client's 5 s
            assert http.post(f"{base}/v1/chat/completions", json=OK).status_code == 200
            time.sleep(6)
            assert http.post(f"{base}/v1/chat/completions", json=OK).status_code == 200
        # A streaming client that never reads: the server's writes back up and block.
        body = {**OK, "n": 8, "max_tokens": 4000, "ignore_eos": True, "stream": True,
                "logprobs": True, "top_logprobs": 20}  # fmt: skip
        raw = json.dumps(body).encode()
        stuck = socket.create_connection(("127.0.0.1", port))
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(raw)).encode()
            + b"\r\n\r\n"
            + raw
        )
        time.sleep(3)  # generation under way, writes blocked
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)  # a hang bound: without a graceful-shutdown limit, forever
        except subprocess.TimeoutExpired:
            pytest.fail("the server ignored SIGTERM while a client held a stream open")
        stuck.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
