"""Overhead of one trivial MCP tool call through `MCPToolset`, with session reuse vs without.

Calls `add(1, 2)` on the bundled MCP server (`examples/mcp_server/server.py`):

- `reused_stdio`: one stdio session for all calls (what MCPToolset does);
- `in_process`: the server object in-process (the floor: no pipes, no JSON over stdio);
- `process_per_call`: a new stdio server process and session for every call (what a
  naive integration does), for scale.

Median and p95 per call, and the ratio. Target: reused stdio <= 5 ms per call.
Left out: HTTP transports and large payloads.

    .venv/bin/python -m bench.probes.mcp_overhead [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import time
from pathlib import Path
from typing import Any

from art_mcp import MCPToolset
from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("mcp_overhead") / "mcp_overhead.json"
SERVER = "python -m examples.mcp_server.server"


async def _time(calls: int, fn: Any) -> list[float]:
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


async def bench(calls: int, fresh_calls: int) -> dict[str, Any]:
    from examples.mcp_server.server import server

    times: dict[str, list[float]] = {}
    async with MCPToolset(SERVER) as ts:
        await ts.call("add", {"a": 1, "b": 2})

        async def reused() -> None:
            assert (await ts.call("add", {"a": 1, "b": 2})).text == "3"

        times["reused_stdio"] = await _time(calls, reused)
    async with MCPToolset(server) as ts_in:

        async def inproc() -> None:
            assert (await ts_in.call("add", {"a": 1, "b": 2})).text == "3"

        times["in_process"] = await _time(calls, inproc)

    async def fresh() -> None:
        async with MCPToolset(SERVER) as t:
            assert (await t.call("add", {"a": 1, "b": 2})).text == "3"

    times["process_per_call"] = await _time(fresh_calls, fresh)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return {
        "benchmark": "mcp_overhead",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(),
        "settings": {"calls": calls, "fresh_calls": fresh_calls, "cores": os.cpu_count()},
        "median_ms": med,
        "p95_ms": {k: sorted(v)[int(0.95 * len(v))] * 1000 for k, v in times.items()},
    }


def table(r: dict[str, Any]) -> str:
    med, p95 = r["median_ms"], r["p95_ms"]
    rows = [
        f"{r['settings']['cores']} cores; {r['settings']['calls']} calls of `add(1, 2)` "
        f"({r['settings']['fresh_calls']} for process_per_call)",
        "",
        "| path | median ms/call | p95 ms/call | × reused |",
        "|---|---:|---:|---:|",
    ]
    for k in ("in_process", "reused_stdio", "process_per_call"):
        rows.append(f"| {k} | {med[k]:.2f} | {p95[k]:.2f} | {med[k] / med['reused_stdio']:.2f} |")
    ok = "met" if med["reused_stdio"] <= 5 else "missed"
    rows += ["", f"target reused stdio <= 5 ms per call: {med['reused_stdio']:.2f} ms ({ok})"]
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--fresh-calls", type=int, default=10)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    r = asyncio.run(bench(a.calls, a.fresh_calls))
    r["markdown"] = table(r)
    print(r["markdown"])
    write_results(a.out, r)
    if a.out == RESULTS and update_docs("mcp_overhead", r["markdown"]):
        print("updated docs/benchmarks.md")


if __name__ == "__main__":
    main()
