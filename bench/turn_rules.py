"""The MCP harness's turn rules, chosen across task shapes on validation slices only.

An arm is a set of `art-mcp train` turn flags (`--max-turns`, `--final-answer-turn`,
`--after-repeat`); every other flag stays at its default. Each run trains one task
with one arm and one seed on the task's validation slice (`bench.learning.validation_file`:
a quarter of its training entities held out, and of their wordings where the scenarios
name them; its own held-out scenarios never seen), one
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

import sys

from bench import sweep

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


def main(argv: list[str] | None = None) -> None:
    sweep.main(argv, __doc__ or "", ARMS, "turn_rules", "Turn rules")


if __name__ == "__main__":
    sys.exit(main())
