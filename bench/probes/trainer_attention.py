"""One GRPO trainer step on an agent-shaped batch: dense mask vs segments, and a prefix tree.

The batch has the shape of one real-model agent step (`bench.agent_rollouts --step`):
`--groups` groups of `--group-size` sequences, each group sharing a `--head`-token prompt
(system prompt, tools, task), then `--turns` turns of a 25-token completion (trained) and a
40-token tool result (not trained). Token ids are random; advantages are +-1. With
prefix sharing on (the default) each group's prompt is written once, its rests after it.

Three settings on the same trainer, one after the other in one process, `--warmup` untimed
steps then `--steps` timed ones each (median):

- `dense`: attention under the packed rows' (L, L) mask (`ModelConfig(segmented_attention=False)`),
  every group's head its own tokens;
- `segments`: each block attends to the keys it sees alone (the default; `training/segmented_attention.py`),
  the same batch;
- `segments + tree`: the same shapes, but the first `--system` tokens of every head are
  the same in all groups, as an agent's system prompt and tool specs are (~650 tokens on
  the MCP harness): the trainer's prefix tree writes them once for the whole step. The
  batch with separate heads is what a step cost when only a group's whole prompt was shared.

    .venv/bin/python -m bench.probes.trainer_attention [--compute-dtype auto|float32|bfloat16]

Left out: rollouts (bench.agent_rollouts), GPUs.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.readme import publish, results_dir

RESULTS = results_dir("trainer_attention") / "trainer_attention.json"


def _batch(args: argparse.Namespace, system: int) -> list[Any]:
    from art_langgraph.training.tensorize import TrainSequence

    rng = random.Random(0)
    seqs = []
    common = [rng.randrange(1000, 40000) for _ in range(system)]
    for _ in range(args.groups):
        head = common + [rng.randrange(1000, 40000) for _ in range(args.head - system)]
        for _ in range(args.group_size):
            tokens, trainable = list(head), [False] * args.head
            for _ in range(args.turns):
                tokens += [rng.randrange(1000, 40000) for _ in range(25)]
                trainable += [True] * 25
                tokens += [rng.randrange(1000, 40000) for _ in range(40)]
                trainable += [False] * 40
            lps = [-1.0 if t else float("nan") for t in trainable]
            seqs.append(TrainSequence(tokens, trainable, lps, rng.choice([-1.0, 1.0])))
    return seqs


ARMS = {"dense": (False, False), "segments": (True, False), "segments + tree": (True, True)}
"""name -> (segmented attention, a system prompt common to all groups)."""


def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    """One arm, in this process: its median step time, loss, tokens and peak RSS."""
    import resource

    from art_langgraph.presets.resolve import resolve_preset
    from art_langgraph.runtime.devices import cpu_has_fast_bf16
    from art_langgraph.training.config import ModelConfig, TrainConfig
    from art_langgraph.training.trainer import LoRATrainer

    segmented, tree = ARMS[args.arm]
    compute = args.compute_dtype
    if compute == "auto":
        compute = "bfloat16" if cpu_has_fast_bf16() else "float32"
    model_config = ModelConfig(compute_dtype=compute, segmented_attention=segmented)
    trainer = LoRATrainer(resolve_preset(args.base_model), model_config)
    config = TrainConfig(learning_rate=1e-5, micro_batch_tokens=args.micro_batch_tokens)
    seqs = _batch(args, args.system if tree else 0)
    times = []
    metrics: dict[str, float] = {}
    for k in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        metrics = trainer.rl_step(seqs, config)
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
    return {
        "compute_dtype": compute,
        "step_s": statistics.median(times),
        "loss": metrics["loss"],
        "processed_tokens": sum(len(s) for s in seqs) - metrics["shared_prefix_tokens"],
        "trainable_tokens": metrics["trainable_tokens"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--compute-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--head", type=int, default=650)
    p.add_argument("--system", type=int, default=600, help="head tokens common to all groups")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated, of: " + ", ".join(ARMS))
    p.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run one arm, print its JSON
    args = p.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args)), flush=True)
        return

    rows: dict[str, dict[str, Any]] = {}
    for name in args.arms.split(","):
        # Each arm in a process of its own: its peak RSS is its own.
        argv = sys.argv[1:]
        out = subprocess.run(
            [sys.executable, "-m", "bench.probes.trainer_attention", *argv, "--arm", name],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        rows[name] = json.loads(out.strip().splitlines()[-1])
        print(f"{name}: {rows[name]}", flush=True)
    first = next(iter(rows.values()))
    compute = first["compute_dtype"]
    base = first["step_s"]
    lines = [
        f"{args.base_model}, {args.groups} groups x {args.group_size}, {args.head}-token heads, "
        f"{args.turns} turns, {compute} compute, micro-batches of {args.micro_batch_tokens} "
        f"tokens, 2 cores ({platform.machine()}); tree: the first {args.system} head tokens "
        "common to all groups",
        "",
        f"| arm | step (s) | vs {next(iter(rows))} | processed tokens | processed tokens/s "
        "| peak RSS (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['step_s']:.1f} | {base / r['step_s']:.2f}x | "
            f"{r['processed_tokens']:,.0f} | {r['processed_tokens'] / r['step_s']:.0f} | "
            f"{r['peak_rss_mib']:.0f} |"
        )
    publish("trainer_attention", RESULTS, lines, args, compute_dtype=compute, rows=rows)


if __name__ == "__main__":
    main()
