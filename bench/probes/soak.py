"""Soak: the OpenAI server under 256 concurrent clients for about two minutes, a share of
them careless or hostile.

`art-langgraph serve` (tiny preset) runs as a subprocess on a free loopback port. Each
client loops until the time is up, picking per request (seeded):

- 70% normal: a 16-token chat completion, which must answer 200;
- 15% abandoned: 8 choices x 400 tokens with `ignore_eos`, dropped by the client after
  0.5 s (the server must cancel them, or they crowd out everyone else);
- 10% malformed: a body from a fixed corpus of broken requests, which must get a 400;
- 5% oversized: a 5 MiB body, which must get a 413.

Reported: answered / failed per kind, p50/p95 latency of the normal requests, the server's
RSS at the start, its peak and at the end (from /proc), and the latency of one fresh request
before and after the soak (their ratio says whether the server came back).

    .venv/bin/python -m bench.probes.soak [--seconds 120 --clients 256]

Left out: streaming clients (they are cancelled by the same path), multiple servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.readme import ROOT, results_dir, update_docs, write_results

RESULTS = results_dir("soak") / "soak.json"
USER = [{"role": "user", "content": "Name three colours."}]
NORMAL = {"model": "tiny", "messages": USER, "max_tokens": 16, "temperature": 0.7}
ABANDON = {**NORMAL, "n": 8, "max_tokens": 400, "ignore_eos": True}
MALFORMED: list[Any] = [
    {**NORMAL, "messages": [{"role": "assistant", "content": "x", "tool_calls": True}]},
    {
        **NORMAL,
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": ["a"]}},
            }
        ],
    },
    {**NORMAL, "seed": 2**64},
    {**NORMAL, "n": 0},
    {**NORMAL, "messages": []},
    {**NORMAL, "temperature": "hot"},
    {**NORMAL, "tool_choice": {"type": "function", "function": "f"}},
    "not an object",
    {"model": "tiny", "messages": [[[[[[[[]]]]]]]]},
]
KINDS = [("normal", 0.70), ("abandoned", 0.15), ("malformed", 0.10), ("oversized", 0.05)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def _fresh(http: httpx.AsyncClient, url: str) -> float:
    t0 = time.perf_counter()
    r = await http.post(url, json=NORMAL)
    r.raise_for_status()
    return time.perf_counter() - t0


async def soak(url: str, pid: int, seconds: float, clients: int, seed: int) -> dict[str, Any]:
    stats: dict[str, dict[str, int]] = {k: {"sent": 0, "ok": 0, "failed": 0} for k, _ in KINDS}
    latencies: list[float] = []
    errors: dict[str, int] = {}
    big = json.dumps({**NORMAL, "messages": [{"role": "user", "content": "x" * (5 << 20)}]})
    limits = httpx.Limits(max_connections=clients + 16, max_keepalive_connections=clients + 16)
    peak = [_rss_mib(pid)]
    end = time.monotonic() + seconds

    async def sample() -> None:
        while time.monotonic() < end:
            peak.append(_rss_mib(pid))
            await asyncio.sleep(1)

    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        await _fresh(http, url)  # warm-up
        fresh_before = await _fresh(http, url)
        rss_start = _rss_mib(pid)

        async def client(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            names, weights = zip(*KINDS, strict=True)
            while time.monotonic() < end:
                kind = rng.choices(names, weights)[0]
                stats[kind]["sent"] += 1
                t0 = time.perf_counter()
                try:
                    if kind == "normal":
                        r = await http.post(url, json=NORMAL)
                        good = r.status_code == 200
                        if good:
                            latencies.append(time.perf_counter() - t0)
                    elif kind == "abandoned":
                        task = asyncio.create_task(http.post(url, json=ABANDON))
                        await asyncio.wait({task}, timeout=0.5)
                        task.cancel()
                        good = True  # abandoning is the point; the cost shows in the others
                    elif kind == "malformed":
                        body = rng.choice(MALFORMED)
                        r = await http.post(url, json=body)
                        good = r.status_code == 400 and "error" in r.json()
                    else:
                        r = await http.post(
                            url, content=big, headers={"content-type": "application/json"}
                        )
                        good = r.status_code == 413
                except (httpx.HTTPError, ValueError) as exc:
                    good = False
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                stats[kind]["ok" if good else "failed"] += 1

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(client(i) for i in range(clients)))
        await sampler
        await asyncio.sleep(2)  # let cancelled work drain
        fresh_after = await _fresh(http, url)
    return {
        "seconds": seconds,
        "clients": clients,
        "kinds": stats,
        "transport_errors": errors,
        "normal_p50_s": _pct(latencies, 0.5),
        "normal_p95_s": _pct(latencies, 0.95),
        "rss_start_mib": rss_start,
        "rss_peak_mib": max(peak),
        "rss_end_mib": _rss_mib(pid),
        "fresh_before_s": fresh_before,
        "fresh_after_s": fresh_after,
    }


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"{r['clients']} concurrent clients for {r['seconds']:.0f} s against `art-langgraph "
        "serve` (tiny preset, 2 CPU cores); seed 0",
        "",
        "| kind | sent | as expected | failed |",
        "|---|---:|---:|---:|",
    ]
    expect = {
        "normal": "200",
        "abandoned": "dropped at 0.5 s",
        "malformed": "400",
        "oversized": "413",
    }
    for kind, s in r["kinds"].items():
        lines.append(f"| {kind} ({expect[kind]}) | {s['sent']} | {s['ok']} | {s['failed']} |")
    lines += [
        "",
        "| measure | value |",
        "|---|---:|",
        f"| normal requests p50 / p95 | {r['normal_p50_s']:.2f} s / {r['normal_p95_s']:.2f} s |",
        f"| server RSS start / peak / end | {r['rss_start_mib']:.0f} / {r['rss_peak_mib']:.0f} / "
        f"{r['rss_end_mib']:.0f} MiB |",
        f"| a fresh request before / after the soak | {r['fresh_before_s']:.2f} s / "
        f"{r['fresh_after_s']:.2f} s ({r['fresh_after_s'] / r['fresh_before_s']:.2f}x) |",
        f"| transport errors | {sum(r['transport_errors'].values())} |",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "art_langgraph.cli", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        result = asyncio.run(
            soak(f"{base}/v1/chat/completions", proc.pid, args.seconds, args.clients, args.seed)
        )
    finally:
        proc.terminate()
        proc.wait(30)
    table = markdown(result)
    print(table)
    write_results(args.out, result)
    if args.out == RESULTS:
        update_docs("soak", table)


if __name__ == "__main__":
    main()
