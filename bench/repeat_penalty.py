"""The repeat penalty (`art-mcp train --repeat-penalty P`), chosen across task shapes on
validation slices only.

After RL the two-hop task's agent often repeats a lookup it has made and still gets the
full reward (the 0cefb6b seeds: repeated calls per solved episode rose on 4 of 5). An arm
subtracts P from a solved training rollout's reward for each repeated call
(`HarnessConfig.repeat_penalty`); `off` was the default when it ran (0.1 is now, by its
table: docs/benchmarks.md). Each run trains one task with
one arm and one seed on the task's validation slice (`bench.sweep`); the table gives per
task and arm the seeds' mean sampled rise, the success after, the repeated calls per
solved episode before and after RL, and the wall time: a penalty that removes repeats but
costs success is no gain.

    .venv/bin/python -m bench.repeat_penalty --seeds 1,2 --out runs/penalty
    .venv/bin/python -m bench.repeat_penalty --seeds 1,2 --out runs/penalty --combine

Left out: BFCL (its graph is the user's own, one model call per item: the harness's
penalty never runs there), and choosing for the user: the docs say which arm became the
default and why.
"""

from __future__ import annotations

import sys

from bench import sweep

ARMS = {
    "off": ["--repeat-penalty", "0"],
    "p0.1": ["--repeat-penalty", "0.1"],
}
"""Arm -> its flags: no penalty (the default when the sweep ran), and 0.1 a repeated call,
a tenth of a solved rollout's full reward (the default it chose)."""


def main(argv: list[str] | None = None) -> None:
    sweep.main(argv, __doc__ or "", ARMS, "repeat_penalty", "Repeat penalty")


if __name__ == "__main__":
    sys.exit(main())
