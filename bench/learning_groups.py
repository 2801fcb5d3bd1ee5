"""RL's training groups in kept `bench.learning` runs, read from their trajectories.

`python -m bench.learning --keep DIR` keeps each run's folder (`DIR/mcp/models/<run>/`),
whose `trajectories/train/<step>.jsonl` hold every group RL trained on or skipped. This
tabulates them per run and kind of question (a scenario id's first dash-separated part:
`1hop`, `2hop` on the org chart), so what a run learnt from can be read beside what it
scored:

- `groups`, `rollouts`, and `solved`: the share of rollouts whose task reward (before
  the repeat penalty, `metadata["task_reward"]`) reached 1;
- `spread`: groups whose rewards differed (trained on); `all_solved`, `none_solved`;
- `penalty_only`: of the spread groups, those whose task rewards were all equal, so only
  the repeat penalty gave them a signal;
- `turns_up` and `repeat_turns_up`: the turns RL pushed up (in a spread group's rollouts
  above the group's mean reward), and of those, turns whose tool calls all repeat earlier
  calls of the rollout (`training.prepare.repeated_call_ids`): what
  `--repeated-calls at_most_zero` would hold at 0.

    .venv/bin/python -m bench.learning_groups DIR --results bench/results/learning/learning_org_crn.json

writes `kept_runs_groups_<commit>.json` beside the results file, stamped with the results'
commit and the runs it read. Left out: flat groups trained by `--flat-groups` (their
advantage is the step's; runs of the defaults skip them), and node rewards.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from art_langgraph.training.prepare import repeated_call_ids
from art_langgraph.trajectories.trajectory import Trajectory
from bench.readme import write_results


def _task_reward(t: Trajectory) -> float:
    return float(t.metadata.get("task_reward", t.reward))


def run_groups(folder: Path) -> dict[str, dict[str, float]]:
    """Per kind of question, the counts of one run's training groups (see the module doc)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    solved: dict[str, list[bool]] = defaultdict(list)
    for path in sorted((folder / "trajectories" / "train").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            trajs = [Trajectory.model_validate(t) for t in json.loads(line)["trajectories"]]
            if not trajs:
                continue
            kind = str(trajs[0].metadata.get("scenario", "?")).split("-")[0]
            row = out[kind]
            rewards = [t.reward for t in trajs]
            task = [_task_reward(t) for t in trajs]
            won = [r >= 1.0 for r in task]
            solved[kind] += won
            row["groups"] += 1
            row["rollouts"] += len(trajs)
            row["all_solved"] += all(won)
            row["none_solved"] += not any(won)
            if len(set(rewards)) > 1:
                row["spread"] += 1
                row["penalty_only"] += len(set(task)) == 1
                mean = statistics.fmean(rewards)
                for t in trajs:
                    if t.reward > mean:
                        row["turns_up"] += len(t.calls)
                        row["repeat_turns_up"] += len(repeated_call_ids(t))
    for kind, won in solved.items():
        out[kind]["solved"] = round(sum(won) / len(won), 2)
    return {k: dict(v) for k, v in sorted(out.items())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("keep", type=Path, help="the --keep folder of bench.learning's runs")
    p.add_argument("--results", type=Path, required=True, help="the runs' results file")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    names = [r["run"] for r in results["rows"]]
    commits = sorted({str(r["commit"]) for r in results["rows"]})
    if len(commits) != 1:
        raise SystemExit(f"runs of more than one commit: {commits}")
    runs: dict[str, Any] = {}
    for name in names:
        folder = args.keep / "mcp" / "models" / name
        if not folder.is_dir():
            raise SystemExit(f"{folder}: not kept")
        runs[name] = run_groups(folder)
    dest = args.results.parent / f"kept_runs_groups_{commits[0]}.json"
    write_results(
        dest,
        {
            "commit": commits[0],
            "what": __doc__.split("\n\n")[1] if __doc__ else "",
            "source": args.results.name,
            "runs": runs,
        },
    )
    print(json.dumps(runs, indent=1))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
