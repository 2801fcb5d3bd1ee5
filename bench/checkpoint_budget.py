"""The sweep that chose the trainer's activation budget (`activations.AUTO_CHECKPOINT_BYTES`).

Under `gradient_checkpointing="auto"` the trainer recomputes as many decoder layers as it
takes to keep a micro-batch's activations under a byte budget. Each budget below runs in a
process of its own on the same batch (`bench.trainer_roofline`'s agent and short batches,
`--groups` x 4 sequences), `--warmup` untimed steps then `--steps` timed ones: step time, the layers it
recomputed, and peak RSS (the model, its optimizer and the step; no engine).

    .venv/bin/python -m bench.checkpoint_budget [--groups 4] [--budgets 256,1024,2048]
    .venv/bin/python -m bench.checkpoint_budget --budgets 256 --batches agent \
        --tree-caps on,off --groups 8 --system 30 --head 900 --turns 1   # BFCL-shaped

Budgets are in MiB; 0 recomputes every layer (checkpointing always on), inf none.
`--tree-caps on,off` runs each budget with and without the cap on micro-batches holding a
prefix tree (`LoRATrainer._tree_tokens`; off: as many trees as micro_batch_tokens holds).
Left out: the engine's memory beside it (a whole run: bench.agent_rollouts --step).
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
from bench.trainer_roofline import batch, compute_dtype, cpu_flags

RESULTS = results_dir("checkpoint_budget") / "checkpoint_budget.json"


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    from art_langgraph.presets.resolve import resolve_preset
    from art_langgraph.training import activations
    from art_langgraph.training import trainer as trainer_module
    from art_langgraph.training.config import ModelConfig, TrainConfig

    mib = float(args.budget)
    activations.AUTO_CHECKPOINT_BYTES = (  # type: ignore[misc]
        int(mib * 2**20) if mib != float("inf") else 2**62
    )
    dtype = compute_dtype(args.compute_dtype)
    trainer = trainer_module.LoRATrainer(
        resolve_preset(args.base_model), ModelConfig(compute_dtype=dtype)
    )
    if args.tree_cap == "off":
        trainer._tree_tokens = lambda: None  # type: ignore[method-assign]
    seqs = batch(args.batch, args)
    config = TrainConfig(learning_rate=1e-5)
    times, recomputed = [], 0
    for k in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        metrics = trainer.rl_step(seqs, config)
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
        recomputed = sum(bool(m.gradient_checkpointing) for m in trainer._checkpointed)
    passes = len(trainer._micro_batches(seqs, config)[0])
    return {
        "budget_mib": args.budget,
        "tree_cap": args.tree_cap,
        "passes": passes,
        "dtype": dtype,
        "step_s": statistics.median(times),
        "layers_recomputed": recomputed,
        "layers": len(trainer._checkpointed),
        "processed_tokens": sum(len(s) for s in seqs) - metrics["shared_prefix_tokens"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--compute-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--budgets", default="256,1024,2048")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--head", type=int, default=500)
    p.add_argument("--system", type=int, default=450)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--batches", default="agent,short", help="of bench.trainer_roofline's")
    p.add_argument("--tree-caps", default="on", help="on and/or off, comma-separated")
    p.add_argument("--budget", help=argparse.SUPPRESS)
    p.add_argument("--tree-cap", help=argparse.SUPPRESS)
    p.add_argument("--batch", help=argparse.SUPPRESS)
    args = p.parse_args()
    reexec_with_tcmalloc()  # as art-mcp runs (art_langgraph/runtime/allocator.py); every arm alike
    if args.budget is not None:
        print(json.dumps(run_one(args)), flush=True)
        return
    rows = []
    for name in args.batches.split(","):
        for b, cap in [(b, c) for b in args.budgets.split(",") for c in args.tree_caps.split(",")]:
            argv = [*sys.argv[1:], "--budget", b, "--batch", name, "--tree-cap", cap]
            out = subprocess.run(
                [sys.executable, "-m", "bench.checkpoint_budget", *argv],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            rows.append({"batch": name, **json.loads(out.strip().splitlines()[-1])})
            print(rows[-1], flush=True)
    lines = [
        f"{args.base_model}, {rows[0]['dtype']}, 2 cores ({platform.machine()}, CPU flags: "
        f"{cpu_flags()}), malloc: {allocator_in_use()}; bench.trainer_roofline's batches, "
        f"{args.groups} x {args.group_size} sequences (agent: prefix trees)",
        "",
        "| batch | activation budget (MiB) | tree cap | passes | layers recomputed | step (s) "
        "| processed tok/s | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['budget_mib']} | {r['tree_cap']} | {r['passes']} | "
            f"{r['layers_recomputed']} / {r['layers']} | "
            f"{r['step_s']:.1f} | {r['processed_tokens'] / r['step_s']:.0f} | "
            f"{r['peak_rss_mib']:.0f} |"
        )
    # The tree-cap comparison is its own table (the budget sweep's stays as it chose 256 MiB).
    name = "checkpoint_budget" if args.tree_caps == "on" else "checkpoint_budget_trees"
    publish(name, RESULTS.with_name(f"{name}.json"), lines, args, rows=rows)


if __name__ == "__main__":
    main()
