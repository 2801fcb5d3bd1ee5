"""The torch engine's fast-forward through forced tokens (`TorchEngineConfig.fast_forward`)
against one decode step a token, on the BFCL app's untrained evaluation.

The workload is examples/bfcl's evaluation as it runs: SmolLM2-135M-Instruct through
`model.chat_model().bind_tools(...)` under `tool_choice="required"` (so every call is
constrained by a tool-call grammar, as in the MCP harness), greedy and sampled at T=1, and
irrelevance greedy under "auto", on `--items` items a category of the training half's
validation slice (never the held-out half). Each arm runs in a child process of its own,
the arms alternating, `--repeats` times. Reported: the evaluation's wall time and its
ratio, decode steps, completion tokens and the share fed as forced runs, peak RSS, and
whether the greedy verdicts agree (the same tokens give the same verdicts; sampled ones
draw differently, as a forced token no longer draws a uniform).

    .venv/bin/python -m bench.probes.fast_forward [--items 10 --repeats 2]

Needs BFCL's environment (`./scripts/setup-bfcl.sh`). Left out: training (the trainer
sees the same tokens either way), vLLM (which has no fast-forward), GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from art_langgraph.runtime.devices import matmul_flags
from bench.readme import alternate_arms, child_or_args, publish, results_dir

RESULTS = results_dir("fast_forward") / "fast_forward.json"
ARMS = ["stepwise", "fast_forward"]


def child(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    import art_langgraph as art
    from art_langgraph.engine import TorchEngineConfig
    from examples.bfcl.app import Run, parser

    out = tempfile.mkdtemp()
    bfcl_args = parser().parse_args(
        ["--eval-limit", str(args.items), "--eval-split", "validation", "--out", out]
    )

    async def run() -> dict[str, Any]:
        bfcl = Run(bfcl_args)
        # guesses off in both arms: this measures the forced runs alone (bench.speculative)
        config = TorchEngineConfig(fast_forward=arm == "fast_forward", speculative_tokens=0)
        backend = art.LocalBackend(
            path=Path(out) / "art", engine=art.EngineChoice(kind="torch", config=config)
        )
        model = art.TrainableModel(name="m", project="p", base_model=args.base_model)
        try:
            await model.register(backend)
            engine: Any = backend.engine
            t0 = time.perf_counter()
            result = await bfcl.evaluate(model, arm)
            wall = time.perf_counter() - t0
            m = engine.metrics()
            steps, forced = engine.steps, engine.forced_tokens
        finally:
            bfcl.checker.close()
            await backend.close()
        return {
            "arm": arm,
            "wall_s": wall,
            "decode_steps": steps,
            "generation_tokens": m.generation_tokens,
            "forced_tokens": forced,
            "prompt_tokens": m.prompt_tokens,
            "prefix_hits": m.prefix_cache_hits,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "per_item": result["per_item"],
        }

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=10, help="validation items a category")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--base-model", default="smollm2-135m")
    args = child_or_args(ap, ARMS, RESULTS, child)
    if args is None:
        return
    flags = ["--items", str(args.items), "--base-model", args.base_model]
    runs = alternate_arms("bench.probes.fast_forward", ARMS, args.repeats, flags)
    greedy = [
        {k: v for k, v in r.pop("per_item").items() if "greedy" in k}
        for rs in runs.values()
        for r in rs
    ]
    agree = all(g == greedy[0] for g in greedy)
    keys = ("wall_s", "decode_steps", "generation_tokens", "forced_tokens", "peak_rss_mib")
    med = {a: {k: statistics.median(r[k] for r in rs) for k in keys} for a, rs in runs.items()}
    base = med["stepwise"]
    lines = [
        f"host CPU flags: {matmul_flags()}; "
        f"SmolLM2-135M-Instruct, the engine's default dtype on the CPU; the BFCL app's untrained "
        f"evaluation (greedy and T=1 under tool_choice=required, irrelevance also greedy "
        f"under auto) on {args.items} validation items a category; median of {args.repeats} "
        "alternating runs, each arm in its own process",
        "",
        "| decode | wall s | x faster | decode steps | completion tokens | fed as forced runs "
        "| peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for a in ARMS:
        m = med[a]
        lines.append(
            f"| {a} | {m['wall_s']:.0f} | {base['wall_s'] / m['wall_s']:.2f} | "
            f"{m['decode_steps']:.0f} | {m['generation_tokens']:.0f} | "
            f"{m['forced_tokens'] / max(1, m['generation_tokens']):.0%} | {m['peak_rss_mib']:.0f} |"
        )
    lines += ["", f"Greedy verdicts identical across arms and runs: {'yes' if agree else 'NO'}."]
    publish("fast_forward", Path(args.out), lines, args, runs=runs, medians=med, greedy_agree=agree)


if __name__ == "__main__":
    main()
