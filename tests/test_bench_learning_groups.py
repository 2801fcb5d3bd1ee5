"""bench.learning_groups: a kept run's training groups counted per kind of question, from
trajectories written as the harness writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_langgraph.trajectories.trajectory import LLMCall, Trajectory, TrajectoryGroup
from bench.learning_groups import main, run_groups


def _rollout(scenario: str, reward: float, task: float, lookups: list[str]) -> Trajectory:
    calls = [
        LLMCall(response_message={"role": "assistant", "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "lookup", "arguments": a}}
        ]})
        for k, a in enumerate(lookups)
    ]  # fmt: skip
    meta = {"scenario": scenario, "task_reward": task}
    return Trajectory(reward=reward, calls=calls, metadata=meta)


def _keep(tmp_path: Path) -> Path:
    folder = tmp_path / "keep" / "mcp" / "models" / "seed-1" / "trajectories" / "train"
    folder.mkdir(parents=True)
    groups = [
        # two-hop: solved twice, once with a repeat (0.9 after the penalty): spread by the
        # penalty alone, and the solution without the repeat is the one pushed up
        [_rollout("2hop-x-a-0", 1.0, 1.0, ['{"p": 1}', '{"q": 2}']),
         _rollout("2hop-x-a-0", 0.9, 1.0, ['{"p": 1}', '{"p": 1}', '{"q": 2}'])],
        # one-hop: one right with a repeat, one wrong: the repeat is pushed up with it
        [_rollout("1hop-y-b-1", 1.0, 1.0, ['{"p": 3}', '{"p": 3}']),
         _rollout("1hop-y-b-1", 0.0, 0.0, ['{"p": 4}'])],
        # one-hop, flat: both wrong
        [_rollout("1hop-y-c-2", 0.0, 0.0, ['{"p": 5}']),
         _rollout("1hop-y-c-2", 0.0, 0.0, ['{"p": 5}'])],
    ]  # fmt: skip
    lines = [TrajectoryGroup(g).model_dump_json() for g in groups]
    (folder / "0001.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "keep"


def test_groups_are_counted_per_kind_with_the_repeats_rl_pushed_up(tmp_path: Path) -> None:
    got = run_groups(_keep(tmp_path) / "mcp" / "models" / "seed-1")
    assert got["2hop"] == {"groups": 1, "rollouts": 2, "all_solved": 1, "none_solved": 0,
                           "spread": 1, "penalty_only": 1, "turns_up": 2, "repeat_turns_up": 0,
                           "solved": 1.0}  # fmt: skip
    assert got["1hop"]["groups"] == 2 and got["1hop"]["spread"] == 1
    assert got["1hop"]["none_solved"] == 1 and got["1hop"]["solved"] == 0.25
    assert got["1hop"]["turns_up"] == 2 and got["1hop"]["repeat_turns_up"] == 1


def test_the_table_is_stamped_with_the_runs_commit(tmp_path: Path) -> None:
    keep = _keep(tmp_path)
    results = tmp_path / "learning_org_x.json"
    results.write_text(json.dumps({"rows": [{"run": "seed-1", "commit": "abc1234"}]}))
    main([str(keep), "--results", str(results)])
    saved = json.loads((tmp_path / "kept_runs_groups_abc1234.json").read_text())
    assert saved["commit"] == "abc1234" and saved["source"] == results.name
    assert set(saved["runs"]["seed-1"]) == {"1hop", "2hop"}
    results.write_text(json.dumps({"rows": [{"run": "seed-2", "commit": "abc1234"}]}))
    with pytest.raises(SystemExit, match="not kept"):
        main([str(keep), "--results", str(results)])
