"""Throughput of the OpenAI-compatible server (tiny preset, or `--base-model`) against plain `generate`.

What it measures: completion tokens per second, wall time and per-request latency
(p50/p95) for N prompts (default 32) of varied length, each completed to exactly
`--max-tokens` tokens (sampling at temperature 1; `ignore_eos` on the server,
`min_new_tokens` for `generate`, so every path produces the same token count):

- `sequential`: one `model.generate` per prompt, one after another (the naive baseline);
- `batched_generate`: one left-padded batched `model.generate` of all prompts (what this
  machine can do with the whole batch known up front: the ceiling);
- `server_continuous` / `server_dynamic`: N concurrent chat-completion requests over HTTP
  (openai client, asyncio.gather) to `start_server` around a `TorchEngine` scheduling
  "continuous" / "dynamic";
- `*_staggered`: the same with request i sent at i * `--stagger-ms`, where continuous
  batching (new requests join the running batch) and dynamic batching (they wait for
  the batch to drain) differ. Their wall time runs from the first send to the last
  answer, so it includes the arrival window.

Each path is warmed up once, then run `--repeats` times, round-robin across paths so
that the noise of a shared machine falls on all of them alike; the table reports
medians and the ratios of tokens/s to `sequential` and to `batched_generate`. Also
reported: the process's peak RSS and, for the server paths, the engine's decode steps.
Raw numbers, settings and the table go to `bench/results/serve_throughput/serve_throughput.json`.

Left out: streaming (SSE), LoRA adapters, grammars, logprobs, prompt-heavy loads
(prefill is small here), GPUs, and quality of the text (the tiny model is random).
The client runs in the same process as the server and the engine (one GIL), and the
two `generate` paths reuse the engine's model while its worker is idle. `generate`
runs with `top_k=0` so that it samples the same plain temperature-1 distribution as
the engine (transformers would otherwise apply its default top-k of 50).

Run (from the repository root):

    .venv/bin/python -m bench.serve_throughput [--requests 32 --max-tokens 64 --repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("serve_throughput") / "serve_throughput.json"

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
    "boxing matches near the river bank and every sailor counts stars before dawn"
).split()

TARGETS = {"x_sequential": 3.0, "x_batched": 0.7}
"""server_continuous should reach these ratios of tokens/s."""


@dataclass
class Run:
    """One timed pass of one path."""

    wall_s: float
    latencies_s: list[float]
    completion_tokens: int
    engine_steps: int | None = None


def make_prompts(n: int) -> list[str]:
    """Distinct prompts whose lengths vary with i (4 to 40 words)."""
    return [
        f"Question {i}: "
        + " ".join(WORDS[(3 * i + j) % len(WORDS)] for j in range(4 + (7 * i) % 37))
        for i in range(n)
    ]


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def encode(tokenizer: Any, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def _generate(model: Any, ids: torch.Tensor, mask: torch.Tensor, m: int, pad_id: int) -> Any:
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=m,
        min_new_tokens=m,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=pad_id,
    )


def _count(out: torch.Tensor, width: int, m: int) -> int:
    new = out.shape[1] - width
    if new != m:
        raise RuntimeError(f"generate made {new} tokens per row, expected {m}")
    return out.shape[0] * new


def run_sequential(model: Any, prompts: list[list[int]], m: int, pad_id: int) -> Run:
    latencies, tokens = [], 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            t = time.perf_counter()
            out = _generate(model, ids, torch.ones_like(ids), m, pad_id)
            latencies.append(time.perf_counter() - t)
            tokens += _count(out, ids.shape[1], m)
    return Run(time.perf_counter() - t0, latencies, tokens)


def run_batched(model: Any, prompts: list[list[int]], m: int, pad_id: int) -> Run:
    """One left-padded batch (padding_side="left", built by hand from the same ids)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = _generate(model, ids, mask, m, pad_id)
    wall = time.perf_counter() - t0
    return Run(wall, [wall] * len(prompts), _count(out, width, m))


async def run_server(
    client: Any, engine: Any, prompts: list[str], prompt_lens: list[int], m: int, stagger_s: float
) -> Run:
    steps0 = engine.steps
    t0 = time.perf_counter()

    async def one(i: int) -> tuple[float, int]:
        if stagger_s:
            await asyncio.sleep(max(0.0, t0 + i * stagger_s - time.perf_counter()))
        t = time.perf_counter()
        resp = await client.chat.completions.create(
            model=engine.served_name,
            messages=[{"role": "user", "content": prompts[i]}],
            max_tokens=m,
            temperature=1.0,
            extra_body={"ignore_eos": True},
        )
        latency = time.perf_counter() - t
        usage = resp.usage
        if usage is None or usage.completion_tokens != m:
            raise RuntimeError(f"request {i}: usage {usage}, expected {m} completion tokens")
        if usage.prompt_tokens != prompt_lens[i]:
            raise RuntimeError(
                f"request {i}: server prompt has {usage.prompt_tokens} tokens, "
                f"generate's has {prompt_lens[i]}: the paths would not do the same work"
            )
        return latency, usage.completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(len(prompts))))
    wall = time.perf_counter() - t0
    return Run(
        wall,
        [lat for lat, _ in results],
        sum(n for _, n in results),
        engine_steps=engine.steps - steps0,
    )


def summarize(runs: list[Run]) -> dict[str, Any]:
    wall = statistics.median(r.wall_s for r in runs)
    tokens = runs[0].completion_tokens
    out: dict[str, Any] = {
        "wall_s": wall,
        "tok_s": tokens / wall,
        "p50_s": statistics.median(percentile(r.latencies_s, 50) for r in runs),
        "p95_s": statistics.median(percentile(r.latencies_s, 95) for r in runs),
        "completion_tokens": tokens,
        "runs": [asdict(r) for r in runs],
    }
    steps = [r.engine_steps for r in runs if r.engine_steps is not None]
    if steps:
        out["engine_steps"] = statistics.median(steps)
    return out


def markdown(summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| path | wall s | tok/s | p50 s | p95 s | × sequential | × batched |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['wall_s']:.3f} | {s['tok_s']:.0f} | {s['p50_s']:.3f} | "
            f"{s['p95_s']:.3f} | {s['x_sequential']:.2f} | {s['x_batched']:.2f} |"
        )
    return "\n".join(lines)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    import openai
    import transformers

    from art_langgraph.engine import TorchEngine, TorchEngineConfig
    from art_langgraph.serving import ModelRegistry, start_server

    torch.manual_seed(args.seed)
    m, stagger_s = args.max_tokens, args.stagger_ms / 1000
    prompts = make_prompts(args.requests)

    engines: dict[str, Any] = {}
    handles: dict[str, Any] = {}
    clients: dict[str, Any] = {}
    try:
        for mode in ("continuous", "dynamic"):
            engines[mode] = TorchEngine.from_pretrained(
                args.base_model, TorchEngineConfig(scheduling=mode)
            )
            engines[mode].served_name = args.base_model  # the name requests use
            handles[mode] = start_server(engines[mode], ModelRegistry(args.base_model))
            clients[mode] = openai.AsyncOpenAI(
                base_url=handles[mode].base_url, api_key="x", max_retries=0, timeout=300
            )
        engine = engines["continuous"]
        model, tok, pad_id = engine.model, engine.tokenizer, engine.pad_token_id
        ids = [encode(tok, p) for p in prompts]
        lens = [len(p) for p in ids]

        def local(fn: Callable[..., Run]) -> Callable[[], Awaitable[Run]]:
            async def go() -> Run:
                return fn(model, ids, m, pad_id)

            return go

        def server(mode: str, stagger: float) -> Callable[[], Awaitable[Run]]:
            async def go() -> Run:
                return await run_server(clients[mode], engines[mode], prompts, lens, m, stagger)

            return go

        paths: dict[str, Callable[[], Awaitable[Run]]] = {
            "sequential": local(run_sequential),
            "batched_generate": local(run_batched),
            "server_continuous": server("continuous", 0.0),
            "server_dynamic": server("dynamic", 0.0),
            "server_continuous_staggered": server("continuous", stagger_s),
            "server_dynamic_staggered": server("dynamic", stagger_s),
        }
        t_start = time.perf_counter()
        warmup: dict[str, float] = {}
        for name, go in paths.items():
            warmup[name] = (await go()).wall_s
            print(f"warm-up {name}: {warmup[name]:.2f} s", file=sys.stderr, flush=True)
        runs: dict[str, list[Run]] = {name: [] for name in paths}
        for rep in range(args.repeats):
            for name, go in paths.items():
                runs[name].append(await go())
            done = ", ".join(f"{n} {r[-1].wall_s:.2f}" for n, r in runs.items())
            print(f"repeat {rep + 1}/{args.repeats}: {done}", file=sys.stderr, flush=True)
        bench_s = time.perf_counter() - t_start
    finally:
        for c in clients.values():
            await c.close()
        for h in handles.values():
            h.stop()
        for e in engines.values():
            e.close_sync()

    summary = {name: summarize(r) for name, r in runs.items()}
    seq, batched = summary["sequential"]["tok_s"], summary["batched_generate"]["tok_s"]
    for s in summary.values():
        s["x_sequential"] = s["tok_s"] / seq
        s["x_batched"] = s["tok_s"] / batched
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    settings = {
        "requests": args.requests,
        "max_tokens": m,
        "repeats": args.repeats,
        "stagger_ms": args.stagger_ms,
        "seed": args.seed,
        "model": args.base_model,
        "prompt_tokens": lens,
    }
    machine = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.cuda.is_available(),
        "device": str(engine.device),
    }
    header = (
        f"machine: {machine['cpu_count']} cores ({machine['torch_threads']} torch threads), "
        f"{machine['device']}, torch {machine['torch']}, transformers {machine['transformers']}; "
        f"settings: {args.base_model}, {args.requests} requests × {m} tokens, prompts {min(lens)}-{max(lens)} "
        f"tokens, {args.repeats} repeats (median), stagger {args.stagger_ms:g} ms; "
        f"peak RSS {peak_rss_mib:.0f} MiB"
    )
    table = markdown(summary)
    cont = summary["server_continuous"]
    target_lines = [
        f"target server_continuous ≥ {TARGETS['x_sequential']:g}× sequential: "
        f"{cont['x_sequential']:.2f}× "
        f"({'met' if cont['x_sequential'] >= TARGETS['x_sequential'] else 'MISSED'})",
        f"target server_continuous ≥ {TARGETS['x_batched']:g}× batched_generate: "
        f"{cont['x_batched']:.2f}× "
        f"({'met' if cont['x_batched'] >= TARGETS['x_batched'] else 'MISSED'})",
    ]
    steps = ", ".join(
        f"{n} {s['engine_steps']:g}" for n, s in summary.items() if "engine_steps" in s
    )
    notes = [f"engine decode steps per run (median): {steps}"]
    return {
        "benchmark": "serve_throughput",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": settings,
        "machine": machine,
        "peak_rss_mib": peak_rss_mib,
        "bench_seconds": bench_s,
        "warmup_wall_s": warmup,
        "targets": TARGETS,
        "paths": summary,
        "header": header,
        "markdown": table,
        "target_lines": target_lines,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32, help="prompts per path (default 32)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per completion")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per path (median)")
    ap.add_argument("--stagger-ms", type=float, default=10.0, help="gap between arrivals")
    ap.add_argument("--seed", type=int, default=0, help="torch seed for generate")
    ap.add_argument("--base-model", default="tiny", help="the preset served: tiny or smollm2-135m")
    ap.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = ap.parse_args(argv)
    block = (
        "serve_throughput" if args.base_model == "tiny" else f"serve_throughput_{args.base_model}"
    )
    if args.out is None:
        args.out = RESULTS.with_name(f"{block}.json")
    if args.requests < 1 or args.max_tokens < 1 or args.repeats < 1 or args.stagger_ms < 0:
        ap.error("--requests, --max-tokens and --repeats must be >= 1, --stagger-ms >= 0")
    result = asyncio.run(bench(args))
    print(result["header"])
    print()
    print(result["markdown"])
    print()
    for line in result["target_lines"] + result["notes"]:
        print(line)
    write_results(args.out, result)
    print(f"saved {args.out}")
    if args.out == RESULTS.with_name(f"{block}.json"):
        text = "\n".join([result["header"], "", result["markdown"], "", *result["target_lines"]])
        if update_docs(block, text):
            print("updated docs/benchmarks.md")


if __name__ == "__main__":
    main()
