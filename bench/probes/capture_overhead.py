"""Capture overhead per LLM call: TrainableChatModel inside `art.capture()` vs plain ChatOpenAI.

Both talk to the same server (the tiny preset on the embedded backend) and ask for one
completion token, so the model's own time is as small as it gets and what differs is
the client side. Three paths, interleaved call by call so the machine's noise falls on
all of them alike:

- `plain`: `langchain_openai.ChatOpenAI` with the same request (logprobs and
  `return_token_ids`), no capture;
- `trainable`: `model.chat_model()` (the subclass that carries token ids into the
  message), no capture;
- `trainable_captured`: the same inside `art.capture()`, which records an `LLMCall`;
- `graph_plain` / `graph_captured`: the plain model in a one-node LangGraph graph, no
  capture, against the trainable one in the same graph inside
  `art.capture(train_nodes=[...])`, whose calls also get their node fields (node,
  namespace, step, thread, checkpoint; the graph has an in-memory checkpointer, and each
  run its own thread, as rollouts have).

The figure of merit is the median added latency per call of `trainable_captured` over
`plain` (target <= 1 ms), plus the capture handler's own time measured directly
(the `TrajectoryCallback` methods timed with perf_counter around each call), and the
same added latency inside a graph (`graph_captured` over `graph_plain`).

Left out: LangGraph's own cost (the same with or without capture) and streaming.

    .venv/bin/python -m bench.probes.capture_overhead [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from langchain_openai import ChatOpenAI

import art_langgraph as art
from art_langgraph.tracing.callback import TrajectoryCallback
from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("capture_overhead") / "capture_overhead.json"


def _timed_handler() -> list[float]:
    """Wrap the handler's hot methods so their own time is recorded."""
    spent: list[float] = []
    for name in ("on_chat_model_start", "on_llm_end"):
        original = getattr(TrajectoryCallback, name)

        def timed(self: Any, *a: Any, _o: Any = original, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return _o(self, *a, **k)
            finally:
                spent.append(time.perf_counter() - t)

        setattr(TrajectoryCallback, name, timed)
    return spent


async def bench(calls: int) -> dict[str, Any]:
    spent = _timed_handler()
    with tempfile.TemporaryDirectory() as tmp:
        async with art.LocalBackend(path=tmp) as backend:
            model = art.TrainableModel(name="bench", project="capture", base_model="tiny")
            await model.register(backend)
            trainable = model.chat_model(max_tokens=1, temperature=0)
            plain = ChatOpenAI(
                model=model.name,
                base_url=model.inference_base_url,
                api_key="local",  # type: ignore[arg-type]
                max_tokens=1,
                temperature=0,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
            prompt = "Say one word."

            async def plain_call() -> None:
                await plain.ainvoke(prompt)

            async def trainable_call() -> None:
                await trainable.ainvoke(prompt)

            async def captured_call() -> None:
                with art.capture() as traj:
                    await trainable.ainvoke(prompt)
                assert traj.calls and traj.calls[0].completion_token_ids

            plain_graph, trainable_graph = _graph(plain), _graph(trainable)
            uncaptured_graph = _graph(trainable)
            threads = itertools.count()

            def config() -> dict[str, Any]:
                # a thread per run, as rollouts are: one thread would grow by two messages
                # a call, and the run's cost with it, on both paths
                return {"configurable": {"thread_id": f"bench-{next(threads)}"}}

            async def graph_plain_call() -> None:
                await plain_graph.ainvoke({"messages": [("user", prompt)]}, config())

            async def graph_trainable_call() -> None:
                await uncaptured_graph.ainvoke({"messages": [("user", prompt)]}, config())

            async def graph_captured_call() -> None:
                with art.capture(train_nodes=["model"]) as traj:
                    await trainable_graph.ainvoke({"messages": [("user", prompt)]}, config())
                (call,) = traj.calls
                assert call.node == "model" and call.checkpoint_id and call.trainable

            paths = {
                "plain": plain_call,
                "trainable": trainable_call,
                "trainable_captured": captured_call,
                "graph_plain": graph_plain_call,
                "graph_trainable": graph_trainable_call,
                "graph_captured": graph_captured_call,
            }
            times: dict[str, list[float]] = {k: [] for k in paths}
            for fn in paths.values():  # warm-up
                for _ in range(10):
                    await fn()
            spent.clear()
            for i in range(calls):
                order = list(paths.items())
                order = order[i % len(order) :] + order[: i % len(order)]  # rotate the first
                for name, fn in order:
                    t = time.perf_counter()
                    await fn()
                    times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}

    # paired differences (same iteration) are less noisy than a difference of medians
    def paired(a: str, b: str) -> float:
        return statistics.median(x - y for x, y in zip(times[a], times[b], strict=True)) * 1000

    handler_per_call = sum(spent) / (2 * calls)  # two captured paths
    return {
        "benchmark": "capture_overhead",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "settings": {"calls": calls, "max_tokens": 1},
        "median_ms": {k: v * 1000 for k, v in med.items()},
        "p95_ms": {k: sorted(v)[int(0.95 * len(v))] * 1000 for k, v in times.items()},
        # what the user pays for the swap and capture: against plain ChatOpenAI
        "added_median_ms": paired("trainable_captured", "plain"),
        "added_in_graph_median_ms": paired("graph_captured", "graph_plain"),
        # what capture alone costs: the same trainable model with and without it
        "capture_only_median_ms": paired("trainable_captured", "trainable"),
        "capture_only_in_graph_median_ms": paired("graph_captured", "graph_trainable"),
        "handler_ms_per_call": handler_per_call * 1000,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _graph(llm: Any) -> Any:
    """START -> model -> END, the model answering the conversation so far."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    async def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"][-1:])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    return graph.compile(checkpointer=InMemorySaver())


def table(r: dict[str, Any]) -> str:
    rows = [
        f"machine: {r['machine']['cores']} cores, Python {r['machine']['python']}; "
        f"{r['settings']['calls']} calls per path, 1 completion token; peak RSS {r['peak_rss_mib']:.0f} MiB",
        "",
        "| path | median ms/call | p95 ms/call | added (median) |",
        "|---|---:|---:|---:|",
    ]
    for k in r["median_ms"]:
        base = "graph_plain" if k.startswith("graph") else "plain"
        added = r["median_ms"][k] - r["median_ms"][base]
        rows.append(
            f"| {k} | {r['median_ms'][k]:.2f} | {r['p95_ms'][k]:.2f} | {added:+.2f} ms vs {base} |"
        )

    def verdict(ms: float) -> str:
        return f"{ms:+.2f} ms ({'met' if ms <= 1 else 'missed'})"

    rows += [
        "",
        "added per call, paired median, target <= 1 ms: trainable_captured over plain "
        f"ChatOpenAI {verdict(r['added_median_ms'])}; capture alone (over the same model "
        f"uncaptured) {verdict(r['capture_only_median_ms'])}; in a graph, with node fields, "
        f"over plain {verdict(r['added_in_graph_median_ms'])}, capture alone "
        f"{verdict(r['capture_only_in_graph_median_ms'])}; the handler's own time: "
        f"{r['handler_ms_per_call']:.3f} ms per call",
    ]
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    r = asyncio.run(bench(a.calls))
    r["markdown"] = table(r)
    print(r["markdown"])
    write_results(a.out, r)
    if a.out == RESULTS and update_docs("capture_overhead", r["markdown"]):
        print("updated docs/benchmarks.md")


if __name__ == "__main__":
    main()
