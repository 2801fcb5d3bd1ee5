"""The SFT warm start's size, learning rate and epochs, chosen on a validation slice only.

When a task's training scenarios carry worked demonstrations, `art-mcp train` warm-starts
on them by default (`HarnessConfig.sft_epochs`: three epochs) before RL. How much a warm
start should do is set here: an arm keeps the demonstrations of `n` training scenarios of
the validation slice (`bench.learning.validation_file`; half one-hop, half two-hop, spread
evenly), drops the rest, warm-starts with its SFT learning rate, and stops before RL
(`--steps 0`), so the run's two evaluations are the untrained model and the model after
the warm start, per slice (`Report.warm_start`). What an arm is judged by: whether the
warm-started model does both kinds of question (a warm start that teaches the calls'
shape but not their arguments leaves RL groups whose rollouts all fail alike), and where
its two-hop success sits against the 0.05-0.40 band the issue set for the model before
RL (one that solves everything leaves RL nothing).

    .venv/bin/python -m bench.warm_start --out runs/warm [--arms d64-lr3e-3,...] [--seed 1]
    .venv/bin/python -m bench.warm_start --out runs/warm --combine

Each run lands in `--out` as `<arm>-s<seed>.json` and is not run again; `--combine`
tabulates them into bench/results/warm_start/warm_start_<host>[_<tag>].json and the
docs (docs/benchmarks.md#warm-start); runs of another commit get their own `--tag`. The
turn rules are pinned in the arms (3 turns, repeats allowed: the defaults when the table was made), so a
later change of the turn defaults does not change what an arm measures.

Left out: RL after the warm start (bench.learning measures it, from the evaluation
before RL), and tasks other than the two-hop org chart (the one whose untrained success
is below the band: capitals and the directory learn from RL alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from art_mcp.scenarios import Scenario, load_scenarios, save_scenarios
from bench.learning import host_key, run_one, validation_file
from bench.readme import results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
TASK = "org"
TURNS = ["--max-turns", "3", "--after-repeat", "allow", "--final-answer-turn", "true"]
ARMS: dict[str, tuple[int, str, int]] = {
    "d64-lr3e-3": (64, "3e-3", 1),
    "d128-lr3e-3": (128, "3e-3", 1),
    "d64-lr1e-3": (64, "1e-3", 1),
    "d128-lr1e-3": (128, "1e-3", 1),
    "d64-lr3e-3-x3": (64, "3e-3", 3),
}
"""Arm -> (training scenarios whose demonstration is kept, SFT learning rate, epochs)."""


def flags(arm: str) -> list[str]:
    """The arm's `art-mcp train` flags beside the task's."""
    _, lr, epochs = ARMS[arm]
    return [
        "--steps",
        "0",
        "--sft-epochs",
        str(epochs),
        "--sft-learning-rate",
        lr,
        "--eval-scenarios",
        "48",
        *TURNS,
    ]


def with_demonstrations(scenarios: list[Scenario], n: int) -> list[Scenario]:
    """`scenarios` with a demonstration on `n` training scenarios (the task's
    `demonstration_ids`: half of each slice, evenly spread in file order over the entities
    of its `taught_entities` since 0cefb6b, over every entity before; made by the task's
    `demonstration`, whichever of them the task file ships) and on no other."""
    from examples.mcp_org.tasks import demonstration, demonstration_ids

    keep = demonstration_ids(scenarios, n)
    return [
        s.model_copy(
            update={
                "demonstration": demonstration(s.task, s.metadata["calls"], s.answer or "")
                if s.id in keep
                else None
            }
        )
        for s in scenarios
    ]


def slice_file(out: Path, n: int) -> Path:
    """The validation slice with `n` demonstrations, written into `out`."""
    path = out / f"{TASK}_validation_d{n}.jsonl"
    base = load_scenarios(validation_file(TASK, out))
    save_scenarios(path, with_demonstrations(base, n))
    return path


def run_all(out: Path, arms: list[str], seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for arm in arms:
        dest = out / f"{arm}-s{seed}.json"
        if dest.exists():
            print(f"{dest.name}: landed already", flush=True)
            continue
        n, lr, epochs = ARMS[arm]
        name = f"{arm}-s{seed}"
        row = run_one(TASK, seed, False, flags(arm), out, name=name, scenarios=slice_file(out, n))
        row.update(arm=arm, demonstrations=n, sft_learning_rate=lr, sft_epochs=epochs)
        row["flags"] = flags(arm)
        row["cpu_flags"] = cpu_flags()
        write_results(dest, row)
        print(f"{name}: {line(row)}", flush=True)


def _cell(row: dict[str, Any], label: str, kind: str) -> str:
    p = row.get("warm_start", {}).get(label, {}).get(kind)
    return f"{p['before']:.2f} -> {p['after']:.2f}" if p and "before" in p else "-"


def line(row: dict[str, Any]) -> str:
    return ", ".join(
        f"{label} sampled {_cell(row, label, 'sampled')}" for label in ("two-hop", "one-hop", "all")
    )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| arm | demonstrations | SFT lr | epochs | two-hop sampled | two-hop greedy | one-hop sampled "
        "| one-hop greedy | in band (two-hop sampled 0.05-0.40) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:---|",
    ]
    for r in rows:
        p = r.get("warm_start", {}).get("two-hop", {}).get("sampled", {})
        band = "yes" if 0.05 <= p.get("after", -1) <= 0.40 else "no"
        lines.append(
            f"| {r['arm']} | {r['demonstrations']} | {r['sft_learning_rate']} | "
            f"{r.get('sft_epochs', 1)} | "
            f"{_cell(r, 'two-hop', 'sampled')} | {_cell(r, 'two-hop', 'greedy')} | "
            f"{_cell(r, 'one-hop', 'sampled')} | {_cell(r, 'one-hop', 'greedy')} | {band} |"
        )
    return "\n".join(lines)


def combine(out: Path, tag: str = "") -> str:
    """The table of the runs in `out`, saved to warm_start_<host>[_<tag>].json and the docs
    block warm_start[_<tag>]; runs of different commits or hosts are never pooled."""
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("d*-s[0-9]*.json"))]
    if not rows:
        raise SystemExit(f"no runs in {out}")
    commits = sorted({r.get("commit", "?") for r in rows})
    hosts = {host_key(r["cpu_flags"]) for r in rows}
    if len(commits) > 1 or len(hosts) > 1:
        raise SystemExit(f"runs of different commits or hosts, never pooled: {commits} {hosts}")
    host = hosts.pop()
    text = (
        f"SFT warm start on the org task's validation slice (untrained -> after the warm start, "
        f"before RL; 48 of the slice's validation scenarios, greedy and 2 samples at T=1); commit {commits[0]}; "
        f"host {host} (CPU flags: {rows[0]['cpu_flags']}).\n\n" + table(rows)
    )
    sfx = f"_{tag}" if tag else ""
    write_results(
        results_dir("warm_start") / f"warm_start_{host}{sfx}.json", {"table": text, "runs": rows}
    )
    update_docs(f"warm_start{sfx}", text)
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, required=True, help="the runs' folder (kept)")
    p.add_argument("--combine", action="store_true", help="tabulate the runs in --out")
    p.add_argument("--tag", default="", help="a suffix for the combined table's file and block")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        p.error(f"unknown arm: {sorted(unknown)}")
    if args.combine:
        print(combine(args.out, args.tag))
        return
    out = args.out.resolve()
    os.chdir(ROOT)  # the task's server is a module of this repository
    run_all(out, arms, args.seed)


if __name__ == "__main__":
    sys.exit(main())
