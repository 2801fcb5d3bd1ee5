"""One GRPO trainer step on an agent-shaped batch, packed rows under a dense mask vs by segments.

The batch has the shape of one real-model agent step (`bench.agent_rollouts --step`):
`--groups` groups of `--group-size` sequences, each group sharing a `--head`-token prompt
(system prompt, tools, task), then `--turns` turns of a 25-token completion (trained) and a
40-token tool result (not trained). Token ids are random; advantages are +-1. With
prefix sharing on (the default) each group is one bundle: its head once, then its rests.

Two settings on the same trainer, one after the other in one process, `--warmup` untimed
steps then `--steps` timed ones each (median):

- `dense`: attention under the packed rows' (L, L) mask (`ModelConfig(segmented_attention=False)`);
- `segments`: each block attends to the keys it sees alone (the default; `training/segments.py`).

    .venv/bin/python -m bench.trainer_attention [--compute-dtype auto|float32|bfloat16]

Left out: rollouts (bench.agent_rollouts), GPUs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench.readme import update_readme, write_results

RESULTS = Path(__file__).resolve().parent / "results" / "trainer_attention.json"


def _batch(args: argparse.Namespace) -> list[Any]:
    from art_langgraph.training.tensorize import TrainSequence

    rng = random.Random(0)
    seqs = []
    for _ in range(args.groups):
        head = [rng.randrange(1000, 40000) for _ in range(args.head)]
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--compute-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--head", type=int, default=650)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--micro-batch-tokens", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()

    from art_langgraph.devices import cpu_has_fast_bf16
    from art_langgraph.presets.resolve import resolve_preset
    from art_langgraph.training.config import ModelConfig, TrainConfig
    from art_langgraph.training.trainer import LoRATrainer

    compute = args.compute_dtype
    if compute == "auto":
        compute = "bfloat16" if cpu_has_fast_bf16() else "float32"
    trainer = LoRATrainer(resolve_preset(args.base_model), ModelConfig(compute_dtype=compute))
    seqs = _batch(args)
    config = TrainConfig(learning_rate=1e-5, micro_batch_tokens=args.micro_batch_tokens)
    rows: dict[str, dict[str, float]] = {}
    for name, segmented in (("dense", False), ("segments", True)):
        trainer.config = trainer.config.model_copy(update={"segmented_attention": segmented})
        times = []
        metrics: dict[str, float] = {}
        for k in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            metrics = trainer.rl_step(seqs, config)
            if k >= args.warmup:
                times.append(time.perf_counter() - t0)
        rows[name] = {
            "step_s": statistics.median(times),
            "loss": metrics["loss"],
            "processed_tokens": sum(len(s) for s in seqs) - metrics["shared_prefix_tokens"],
            "trainable_tokens": metrics["trainable_tokens"],
        }
        print(f"{name}: {rows[name]}", flush=True)
    base = rows["dense"]["step_s"]
    lines = [
        f"{args.base_model}, {args.groups} groups x {args.group_size}, {args.head}-token heads, "
        f"{args.turns} turns, {compute} compute, 2 cores ({platform.machine()})",
        "",
        "| attention | step (s) | vs dense | processed tokens/s |",
        "|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['step_s']:.1f} | {base / r['step_s']:.2f}x | "
            f"{r['processed_tokens'] / r['step_s']:.0f} |"
        )
    print("\n".join(lines))
    write_results(
        RESULTS,
        {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
            "args": vars(args),
            "compute_dtype": compute,
            "rows": rows,
            "table": lines,
        },
    )
    update_readme("trainer_attention", "\n".join(lines))


if __name__ == "__main__":
    main()
