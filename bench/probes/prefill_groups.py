"""The engine's prefill of a GRPO step: rows grouped by shared prompt prefix, each group's
head computed once (`torch_engine._prefix_clusters`), against one head per adapter only
when every row shares it (the rule before), on the real preset (SmolLM2-135M-Instruct).

A step of `--groups` prompts, each with its own ~`--tools-tokens`-token system prompt (an
item's tools, as in BFCL) and `--group-size` rollouts of it, all submitted at once, with
the prefix cache off (so only the grouping differs), `--tokens` greedy tokens each. Each
arm runs in a child process of its own, the arms alternating, `--repeats` times. Reported:
the engine's prefill seconds and the step's wall seconds, the ratio of the medians, peak
RSS, and whether the greedy tokens are identical.

    .venv/bin/python -m bench.probes.prefill_groups [--groups 8 --group-size 4 --repeats 3]

Left out: decode speed (bench.probes.engine_kv), the HTTP server (bench.serve_throughput), GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from art_langgraph.runtime.devices import matmul_flags
from bench.readme import alternate_arms, child_or_args, publish, results_dir

RESULTS = results_dir("prefill_groups") / "prefill_groups.json"
ARMS = ["all_rows_only", "grouped"]
"""The rule before (a head only when every row of an adapter shares it), and the groups."""


def _all_rows_only(prompts: list[list[int]], cached: list[int]) -> list[tuple[list[int], int]]:
    """The rule before: one head for every row, when all of them share one long enough."""
    if len(prompts) < 2:
        return []
    lo, hi = min(prompts), max(prompts)
    n = min(len(lo), len(hi))
    common = next((i for i in range(n) if lo[i] != hi[i]), n)
    shared = max(min(common, min(len(p) for p in prompts) - 1), 0)
    return [(list(range(len(prompts))), shared)] if shared - max(cached) >= 16 else []


def child(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    from art_langgraph.engine import SamplingParams, TorchEngine, TorchEngineConfig
    from art_langgraph.engine import torch_engine as te

    if arm == "all_rows_only":
        te._prefix_clusters = _all_rows_only  # type: ignore[assignment]
    engine = TorchEngine.from_pretrained(
        "smollm2-135m", TorchEngineConfig(prefix_cache_bytes=0, max_batch_size=64)
    )
    tok = engine.tokenizer
    seconds = [0.0]
    prefill = engine._prefill

    def timed(new: list[Any]) -> None:
        t = time.perf_counter()
        prefill(new)
        seconds[0] += time.perf_counter() - t

    engine._prefill = timed  # type: ignore[method-assign]

    def prompt(g: int) -> list[int]:
        tools = " ".join(
            f"tool_{g}_{k}(arg_{k}: int) returns item {g * 100 + k}." for k in range(200)
        )
        words = tok.encode(tools, add_special_tokens=False)[: args.tools_tokens]
        messages = [
            {"role": "system", "content": tok.decode(words)},
            {"role": "user", "content": f"Task {g}: call the right tool for item {g * 100}."},
        ]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tok.encode(text, add_special_tokens=False))

    greedy = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    batch = [prompt(g) for g in range(args.groups) for _ in range(args.group_size)]

    async def step() -> list[list[int]]:
        outs = await asyncio.gather(*(engine.generate(p, greedy) for p in batch))
        return [o.completion_token_ids for o in outs]

    asyncio.run(step())  # warm-up: the same step once
    seconds[0] = 0.0
    t0 = time.perf_counter()
    out = asyncio.run(step())
    wall = time.perf_counter() - t0
    engine.close_sync()
    return {
        "arm": arm,
        "prefill_s": seconds[0],
        "wall_s": wall,
        "prompt_tokens": sum(len(p) for p in batch),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tokens": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--tools-tokens", type=int, default=450)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = child_or_args(ap, ARMS, RESULTS, child)
    if args is None:
        return
    flags = [
        f"--{flag.replace('_', '-')}={getattr(args, flag)}"
        for flag in ("groups", "group_size", "tools_tokens", "tokens")
    ]
    runs = alternate_arms("bench.probes.prefill_groups", ARMS, args.repeats, flags)
    same = all(r["tokens"] == runs[ARMS[0]][0]["tokens"] for rs in runs.values() for r in rs)
    med = {
        a: {k: statistics.median(r[k] for r in rs) for k in ("prefill_s", "wall_s", "peak_rss_mib")}
        for a, rs in runs.items()
    }
    base = med["all_rows_only"]
    lines = [
        f"host CPU flags: {matmul_flags()}; "
        f"SmolLM2-135M-Instruct, the engine's default dtype on the CPU; a step of {args.groups} "
        f"prompts (each its own ~{args.tools_tokens}-token system prompt) x {args.group_size} "
        f"rollouts, {runs[ARMS[0]][0]['prompt_tokens']} prompt tokens in all, {args.tokens} "
        f"greedy tokens each, prefix cache off; median of {args.repeats} alternating runs",
        "",
        "| prefill heads | prefill s | x faster | step wall s | x faster | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for a in ARMS:
        m = med[a]
        lines.append(
            f"| {a} | {m['prefill_s']:.2f} | {base['prefill_s'] / m['prefill_s']:.2f} | "
            f"{m['wall_s']:.2f} | {base['wall_s'] / m['wall_s']:.2f} | {m['peak_rss_mib']:.0f} |"
        )
    lines += ["", f"Greedy tokens identical across arms and runs: {'yes' if same else 'NO'}."]
    for rs in runs.values():
        for r in rs:
            r.pop("tokens")
    publish(
        "prefill_groups", Path(args.out), lines, args, runs=runs, medians=med, identical_tokens=same
    )


if __name__ == "__main__":
    main()
