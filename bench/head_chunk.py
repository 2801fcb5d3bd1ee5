"""The sweep that chose the head's chunk (`logprobs.HEAD_CHUNK_ROWS`): rows of logits at once.

The trainer turns the trained positions' hidden states into log-probabilities a chunk of
rows at a time, and recomputes each chunk in the backward pass; a chunk's float32 logits,
softmax and gradient are live together. Each chunk size runs in a process of its own on
the same batch (`bench.trainer_roofline`'s agent batch, `--groups` x 4 sequences, dtypes
`auto`), `--warmup` untimed steps then `--steps` timed ones: step time and peak RSS (the
model, its optimizer and the step; no engine beside it).

    .venv/bin/python -m bench.head_chunk [--groups 8] [--chunks 1024,512,256,128]

Left out: the engine's memory beside the trainer (a whole run: bench.learning's peak RSS).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from art_langgraph.runtime.allocator import allocator_in_use, reexec_with_tcmalloc
from bench.readme import publish, results_dir
from bench.trainer_roofline import batch, cpu_flags

RESULTS = results_dir("head_chunk") / "head_chunk.json"


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    from art_langgraph.presets.resolve import resolve_preset
    from art_langgraph.training import logprobs
    from art_langgraph.training import trainer as trainer_module
    from art_langgraph.training.config import ModelConfig, TrainConfig

    logprobs.HEAD_CHUNK_ROWS = int(args.chunk)  # type: ignore[misc]
    trainer = trainer_module.LoRATrainer(resolve_preset(args.base_model), ModelConfig())
    seqs = batch("agent", args)
    config = TrainConfig(learning_rate=1e-5)
    times = []
    for k in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        metrics = trainer.rl_step(seqs, config)
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
    return {
        "chunk": int(args.chunk),
        "dtype": str(trainer.compute_dtype).removeprefix("torch."),
        "step_s": statistics.median(times),
        "trained_tokens": metrics["trainable_tokens"],
        "processed_tokens": sum(len(s) for s in seqs) - metrics["shared_prefix_tokens"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--chunks", default="1024,512,256,128")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--head", type=int, default=500)
    p.add_argument("--system", type=int, default=450)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--chunk", help=argparse.SUPPRESS)
    args = p.parse_args()
    reexec_with_tcmalloc()  # as art-mcp runs (art_langgraph/runtime/allocator.py); every arm alike
    if args.chunk is not None:
        print(json.dumps(run_one(args)), flush=True)
        return
    rows = []
    for c in args.chunks.split(","):
        out = subprocess.run(
            [sys.executable, "-m", "bench.head_chunk", *sys.argv[1:], "--chunk", c],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    base = next(r for r in rows if r["chunk"] == max(x["chunk"] for x in rows))
    lines = [
        f"{args.base_model}, {rows[0]['dtype']}, 2 cores ({platform.machine()}, CPU flags: "
        f"{cpu_flags()}), malloc: {allocator_in_use()}; bench.trainer_roofline's agent batch, "
        f"{args.groups} x {args.group_size} sequences, {rows[0]['trained_tokens']:.0f} trained "
        "tokens; one process per row, side by side in one run",
        "",
        "| head chunk (rows) | step (s) | step time / largest chunk's | peak RSS (MiB) "
        "| peak / largest chunk's |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['chunk']} | {r['step_s']:.1f} | {r['step_s'] / base['step_s']:.2f}x | "
            f"{r['peak_rss_mib']:.0f} | {r['peak_rss_mib'] - base['peak_rss_mib']:+.0f} MiB |"
        )
    publish("head_chunk", RESULTS, lines, args, rows=rows)


if __name__ == "__main__":
    main()
