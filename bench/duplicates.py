"""Identical rollouts trained once: the trainer's time on a real run's steps, with the
step's identical sequences merged (`tensorize.merge_duplicates`, what `prepare_step` does)
and with each trained again, side by side.

Once a question type is solved, a group's rollouts often sample the same tokens: on the
org chart's validation slice (seed 3, `--flat-groups batch_baseline_positive`) 95 of a
run's 201 training sequences repeated another of their step. Merged, the trainer computes
one and weighs its loss terms by the count, the same update (tests/training/test_trainer.py
checks loss and gradient) for less compute. This replays the training steps a run kept
(`<model folder>/trajectories/train/*.jsonl`, what `art-mcp train` writes): each step's
groups through `prepare_step` with the run's `flat_groups`, then one `LoRATrainer.rl_step`
on the merged sequences and one on the same sequences each repeated `copies` times, from
the same adapter weights (restored between them), the order alternating step by step. The
table: per step, sequences, those merged away, each arm's seconds and their ratio, and the
two arms' loss and gradient norm (equal up to rounding: a check that they trained the same
thing); saved to bench/results/duplicates/duplicates_<host>.json.

    .venv/bin/python -m bench.duplicates --run runs/mcp/models/NAME --flat-groups skip

Left out: the rollouts (the engine already shares a group's prompt through its prefix
cache) and a whole run's wall time (the trainer's share of it is in the run's own report).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.learning import host_key
from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("duplicates")


def expand(seqs: list[Any]) -> list[Any]:
    """Each merged sequence repeated `copies` times, each copy counted once."""
    return [replace(s, copies=1) for s in seqs for _ in range(s.copies)]


def table(rows: list[dict[str, Any]], head: str) -> str:
    lines = [
        head,
        "",
        "| step | sequences | merged away | each trained s | merged s | merged / each | loss each, merged | grad norm each, merged |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['sequences']} | {r['merged_away']} | {r['each_s']:.1f} "
            f"| {r['merged_s']:.1f} | {r['merged_s'] / r['each_s']:.2f}x "
            f"| {r['loss_each']:.4f}, {r['loss_merged']:.4f} "
            f"| {r['grad_norm_each']:.4f}, {r['grad_norm_merged']:.4f} |"
        )
    each, merged = sum(r["each_s"] for r in rows), sum(r["merged_s"] for r in rows)
    lines.append(
        f"| all | {sum(r['sequences'] for r in rows)} | {sum(r['merged_away'] for r in rows)} "
        f"| {each:.1f} | {merged:.1f} | {merged / each:.2f}x | | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a kept run's model folder")
    p.add_argument("--flat-groups", default="skip", help="the run's TrainConfig.flat_groups")
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--tag", default="", help="names the results file")
    args = p.parse_args(argv)

    import torch

    from art_langgraph.presets.resolve import resolve_preset
    from art_langgraph.runtime.devices import matmul_flags
    from art_langgraph.training.config import ModelConfig, TrainConfig
    from art_langgraph.training.prepare import prepare_step
    from art_langgraph.training.trainer import LoRATrainer
    from art_langgraph.trajectories.trajectory import TrajectoryGroup

    files = sorted((args.run / "trajectories" / "train").glob("*.jsonl"))
    if not files:
        p.error(f"{args.run}/trajectories/train holds no step")
    # the base model's rate, as a backend sets it
    config = TrainConfig(flat_groups=args.flat_groups).for_model(args.base_model)
    trainer = LoRATrainer(resolve_preset(args.base_model), ModelConfig())
    params = {n: q for n, q in trainer.model.named_parameters() if q.requires_grad}
    rows: list[dict[str, Any]] = []
    for k, path in enumerate(files):
        groups = [TrajectoryGroup.model_validate_json(line) for line in path.open()]
        merged, metrics = prepare_step(groups, config, int(path.stem))
        if not merged:
            continue
        start = {n: q.detach().clone() for n, q in params.items()}
        arms = {"merged": merged, "each": expand(merged)}
        got: dict[str, dict[str, float]] = {}
        for arm in ("merged", "each") if k % 2 else ("each", "merged"):
            with torch.no_grad():
                for n, q in params.items():
                    q.copy_(start[n])
            got[arm] = trainer.rl_step(arms[arm], config)
        row = {
            "step": int(path.stem),
            "sequences": len(arms["each"]),
            "merged_away": int(metrics["duplicate_sequences"]),
            **{f"{a}_s": got[a]["train_seconds"] for a in got},
            **{f"loss_{a}": got[a]["loss"] for a in got},
            **{f"grad_norm_{a}": got[a]["grad_norm"] for a in got},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    flags = matmul_flags()
    head = (
        f"The trainer on the kept steps of `{args.run.name}` (flat_groups={args.flat_groups}), "
        f"{args.base_model}, `ModelConfig()`; host {host_key(flags)} (CPU flags: {flags})."
    )
    text = table(rows, head)
    ratios = [r["merged_s"] / r["each_s"] for r in rows]
    name = f"duplicates_{host_key(flags)}{'_' + args.tag if args.tag else ''}"
    write_results(
        RESULTS / f"{name}.json",
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "cpu_flags": flags,
            "median_ratio": statistics.median(ratios),
            "table": text,
            "rows": rows,
        },
    )
    update_docs(name, text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
