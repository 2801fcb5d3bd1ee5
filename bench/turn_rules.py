"""The MCP harness's turn rules, chosen across task shapes on validation slices only.

An arm is a set of `art-mcp train` turn flags (`--max-turns`, `--final-answer-turn`,
`--after-repeat`); every other flag stays at its default. Each run trains one task
with one arm and one seed on the task's validation slice (`bench.learning.validation_file`:
a quarter of its training entities held out, its own held-out scenarios never seen), one
after another, each under the project's watchdog. Tasks: one lookup with recall possible
(capitals), one lookup without (the staff directory), and one or two dependent lookups
(the org chart). A run lands in `--out` as `<task>-<arm>-s<seed>.json` (its figures and
commit) and is not run again. Then the table: per task and arm, the seeds' mean sampled
rise on the validation slice (± sd), the success after, and the wall time; saved to
bench/results/turn_rules/turn_rules_<host>.json.

    .venv/bin/python -m bench.turn_rules --seeds 1,2 --out runs/turns
    .venv/bin/python -m bench.turn_rules --seeds 1,2 --out runs/turns --combine

Left out: BFCL. Its graph is the user's own, one model call per item; the harness's turn
rules never run there, so its train half has nothing to say about them. Choosing for the
user: the docs say which arm became the default and why.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.learning import host_key, run_one, validation_file
from bench.readme import results_dir, write_results
from bench.trainer_roofline import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
ARMS = {
    "now": ["--max-turns", "3", "--final-answer-turn", "true", "--after-repeat", "allow"],
    "turns6": ["--max-turns", "6", "--final-answer-turn", "true", "--after-repeat", "allow"],
    "turns6-answer": ["--max-turns", "6", "--final-answer-turn", "true", "--after-repeat", "answer"],
    "turns6-switch": ["--max-turns", "6", "--final-answer-turn", "true", "--after-repeat", "switch"],
    "turns4-switch": ["--max-turns", "4", "--final-answer-turn", "true", "--after-repeat", "switch"],
}  # fmt: skip
"""Arm -> its turn flags: today's defaults, a generous budget, and the budget with each rule
against a repeated call: answer (the answer turn comes early) or switch (the next turn may
call anything but the repeated tool)."""
TASKS = ("capitals", "directory", "org")


def run_path(out: Path, task: str, arm: str, seed: int) -> Path:
    return out / f"{task}-{arm}-s{seed}.json"


def run_all(out: Path, tasks: list[str], arms: list[str], seeds: list[int]) -> None:
    """Every (seed, task, arm) run not landed yet, arms alternating within a task."""
    out.mkdir(parents=True, exist_ok=True)
    slices = {task: validation_file(task, out) for task in tasks}  # one per task, every seed's
    for seed in seeds:
        for task in tasks:
            scenarios = slices[task]
            for arm in arms:
                dest = run_path(out, task, arm, seed)
                if dest.exists():
                    print(f"{dest.name}: landed already", flush=True)
                    continue
                name = f"{task}-{arm}-s{seed}"
                row = run_one(task, seed, False, ARMS[arm], out, name=name, scenarios=scenarios)
                row.update(task=task, arm=arm, flags=ARMS[arm], cpu_flags=cpu_flags())
                write_results(dest, row)
                print(
                    f"{name}: sampled {row['sampled_before']:.2f} -> {row['sampled_after']:.2f}, "
                    f"{row['wall_s'] / 60:.1f} min",
                    flush=True,
                )


def table(rows: list[dict[str, Any]]) -> str:
    """Per task and arm: the seeds' mean sampled rise (± sd), success after, wall."""
    lines = [
        "| task | arm | seeds | sampled rise (mean ± sd) | sampled after | greedy after | wall min |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for task in dict.fromkeys(r["task"] for r in rows):
        for arm in dict.fromkeys(r["arm"] for r in rows if r["task"] == task):
            rs = [r for r in rows if r["task"] == task and r["arm"] == arm]
            rises = [r["sampled_after"] - r["sampled_before"] for r in rs]
            sd = f" ± {statistics.stdev(rises):.2f}" if len(rises) > 1 else ""
            lines.append(
                f"| {task} | {arm} | {len(rs)} | {statistics.fmean(rises):+.2f}{sd} | "
                f"{statistics.fmean(r['sampled_after'] for r in rs):.2f} | "
                f"{statistics.fmean(r['greedy_after'] for r in rs):.2f} | "
                f"{statistics.fmean(r['wall_s'] for r in rs) / 60:.1f} |"
            )
    return "\n".join(lines)


def combine(out: Path, tag: str) -> str:
    """The table of every run in `out`, saved to
    bench/results/turn_rules/turn_rules_<host>[_tag].json; refused when the runs' commits
    differ."""
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*-s[0-9]*.json"))]
    if not rows:
        raise SystemExit(f"no runs in {out}")
    commits = sorted({r.get("commit", "?") for r in rows})
    if len(commits) > 1:
        raise SystemExit(f"runs of different commits, never pooled: {commits}")
    hosts = {host_key(r["cpu_flags"]) for r in rows}
    if len(hosts) > 1:
        raise SystemExit(f"runs of different host classes, never pooled: {sorted(hosts)}")
    text = (
        f"Turn rules on each task's validation slice; commit {commits[0]}; host "
        f"{hosts.pop()} (CPU flags: {rows[0]['cpu_flags']}); `art-mcp train` defaults but "
        "the arm's flags.\n\n" + table(rows)
    )
    name = f"turn_rules_{host_key(rows[0]['cpu_flags'])}{'_' + tag if tag else ''}"
    write_results(results_dir("turn_rules") / f"{name}.json", {"table": text, "runs": rows})
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--out", type=Path, required=True, help="the runs' folder (kept)")
    p.add_argument("--tag", default="")
    p.add_argument("--combine", action="store_true", help="tabulate the runs in --out")
    args = p.parse_args(argv)
    arms, tasks = args.arms.split(","), args.tasks.split(",")
    if unknown := (set(arms) - set(ARMS)) | (set(tasks) - set(TASKS)):
        p.error(f"unknown arm or task: {sorted(unknown)}")
    if args.combine:
        print(combine(args.out, args.tag))
        return
    out = args.out.resolve()
    os.chdir(ROOT)  # the tasks' servers are modules of this repository
    run_all(out, tasks, arms, [int(s) for s in args.seeds.split(",") if s])


if __name__ == "__main__":
    sys.exit(main())
