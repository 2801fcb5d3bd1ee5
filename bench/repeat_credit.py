"""Credit for repeated calls (`art-mcp train --repeated-calls at_most_zero`), chosen across
task shapes on validation slices only.

The repeat penalty (`--repeat-penalty`, 0.1 by default) ranks a solved rollout that repeats
a call below one that does not, but only within a group where both solved: on the two-hop
task's held-out seed 5 of d282237 no training group had every rollout solved, the penalty
shaped none of its 40 groups with a signal, and repeated calls per solved held-out episode
rose 0.74 -> 1.86 (under `after_repeat="switch"` a repeat also forces the next turn onto
another tool, a shortcut RL can learn). `at_most_zero` trains a turn whose tool calls all
repeat earlier calls of its rollout on the rollout's advantage where negative, else 0
(`TrainConfig.repeated_calls`): a solved rollout no longer reinforces its repeats, and a
failed one still pushes them down. Each run trains one task with one arm and one seed on the
task's validation slice (`bench.sweep`); the table gives per task and arm the seeds' mean
sampled rise, the success after RL, the repeated calls per solved episode before and after
RL, and the wall time: an arm that removes repeats but costs success is no gain.

    .venv/bin/python -m bench.repeat_credit --seeds 1,2 --out runs/credit
    .venv/bin/python -m bench.repeat_credit --seeds 1,2 --out runs/credit --combine

Left out: BFCL (its graph is the user's own, one model call per item: no call there repeats
an earlier one of its rollout), and choosing for the user: the docs say which arm became
the default and why.
"""

from __future__ import annotations

import sys

from bench import sweep

ARMS = {
    "episode": ["--repeated-calls", "episode"],
    "at_most_zero": ["--repeated-calls", "at_most_zero"],
}
"""Arm -> its flags: every call on its rollout's advantage (the default when it was
written), and repeated calls never above 0."""


def main(argv: list[str] | None = None) -> None:
    sweep.main(argv, __doc__ or "", ARMS, "repeat_credit", "Credit for repeated calls")


if __name__ == "__main__":
    sys.exit(main())
