"""`art-langgraph serve` as a user starts it: a real subprocess on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
from openai import OpenAI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_answers_and_shuts_down() -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "art_langgraph.cli",
            "serve",
            "--base-model",
            "tiny",
            "--port",
            str(port),
            "--api-key",
            "k1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k1", max_retries=0)
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert r.model == "tiny@0" and r.usage is not None and r.usage.completion_tokens >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_refuses_a_public_bind_without_a_key() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ART_API_KEY"}
    out = subprocess.run(
        [sys.executable, "-m", "art_langgraph.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 2
    assert "without an API key" in out.stderr
