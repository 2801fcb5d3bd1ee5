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

import sys

from bench import sweep

ARMS = {
    "off": [],
    "refill4": ["--refill-groups", "4"],
    "refill8": ["--refill-groups", "8"],
}
"""Arm -> its flags: today's default (no refills), and up to half or all of a step's
groups refilled."""


def main(argv: list[str] | None = None) -> None:
    sweep.main(argv, __doc__ or "", ARMS, "dynamic_sampling", "Dynamic sampling")


if __name__ == "__main__":
    sys.exit(main())
