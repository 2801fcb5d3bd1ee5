"""Dynamic sampling (`art-mcp train --refill-groups`), chosen across task shapes on
validation slices only.

After a warm start, or once a task is mostly learned, many of a step's groups get one
reward for every rollout and teach nothing (the two-hop task's seed 2: 5 of 8 groups at
its first step). An arm refills up to N such groups a step with other training
scenarios (`HarnessConfig.refill_groups`); `off` is today's default. Each run trains one
task with one arm and one seed on the task's validation slice (`bench.sweep`), and the
table gives per task and arm the seeds' mean sampled rise, the success after and the wall
time: refilling costs rollouts, so a rise bought with much more time is no gain in time
to a better model. Saved to bench/results/dynamic_sampling/.

    .venv/bin/python -m bench.dynamic_sampling --seeds 1,2 --out runs/refill
    .venv/bin/python -m bench.dynamic_sampling --seeds 1,2 --out runs/refill --combine

Left out: BFCL (its graph is the user's own: the harness's refills never run there), and
choosing for the user: the docs say which arm became the default and why.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.sweep import TASKS, combine, run_all

ROOT = Path(__file__).resolve().parent.parent
ARMS = {
    "off": [],
    "refill4": ["--refill-groups", "4"],
    "refill8": ["--refill-groups", "8"],
}
"""Arm -> its flags: today's default (no refills), and up to half or all of a step's
groups refilled."""


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
        print(combine(args.out, "dynamic_sampling", "Dynamic sampling", args.tag))
        return
    out = args.out.resolve()
    os.chdir(ROOT)  # the tasks' servers are modules of this repository
    run_all(out, tasks, {a: ARMS[a] for a in arms}, [int(s) for s in args.seeds.split(",") if s])


if __name__ == "__main__":
    sys.exit(main())
