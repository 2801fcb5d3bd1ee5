"""bench.duplicates: it replays a kept run's training steps, merged and each trained, and
both arms train the same thing (loss and gradient norm agree)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_langgraph.trajectories.trajectory import LLMCall, Trajectory, TrajectoryGroup
from bench import duplicates


def _rollout(tag: int, i: int, reward: float, same_as: int | None = None) -> Trajectory:
    base = 100 * tag + 10 * (i if same_as is None else same_as)
    call = LLMCall(
        node="agent",
        namespace=["agent"],
        prompt_token_ids=[7, 8, 9, 100 * tag],
        completion_token_ids=[base + 1, base + 2, base + 3],
    )
    return Trajectory(id=f"g{tag}t{i}", reward=reward, calls=[call])


def test_a_kept_runs_steps_train_the_same_merged_and_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = tmp_path / "run" / "trajectories" / "train"
    steps.mkdir(parents=True)
    groups = [
        TrajectoryGroup([_rollout(1, 0, 1.0), _rollout(1, 1, 1.0, same_as=0), _rollout(1, 2, 0.0)]),
        TrajectoryGroup([_rollout(2, 0, 0.0), _rollout(2, 1, 1.0)]),
    ]
    (steps / "0002.jsonl").write_text("".join(g.model_dump_json() + "\n" for g in groups))
    monkeypatch.setattr(duplicates, "RESULTS", tmp_path / "results")
    duplicates.main(["--run", str(tmp_path / "run"), "--base-model", "tiny", "--tag", "t"])
    (saved,) = (tmp_path / "results").glob("duplicates_*_t.json")
    (row,) = json.loads(saved.read_text())["rows"]
    assert row["sequences"] == 5 and row["merged_away"] == 1
    assert row["loss_merged"] == pytest.approx(row["loss_each"], abs=1e-6)
    assert row["grad_norm_merged"] == pytest.approx(row["grad_norm_each"], rel=1e-4)
