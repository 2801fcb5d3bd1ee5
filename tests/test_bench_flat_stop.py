"""bench.flat_stop: the replay of "end RL after K flat steps in a row" over recorded runs."""

from __future__ import annotations

import json
from pathlib import Path

from bench import flat_stop


def test_the_rule_fires_on_a_run_of_k_and_never_after_the_last_step() -> None:
    assert flat_stop.stop_after([False, True, True, False, True], 2) == 3
    assert flat_stop.stop_after([True, False, True, False], 2) is None
    assert flat_stop.stop_after([False, False, True, True], 2) is None  # ends where it would
    assert flat_stop.stop_after([True, True, True], 1) == 1


def test_the_replay_counts_skipped_steps_and_their_signal_once_per_run(tmp_path: Path) -> None:
    row = {"run": "seed-1", "task": "t", "zero_variance_groups": [8, 8, 5, 8], "groups": [8] * 4}
    (tmp_path / "a.json").write_text(json.dumps({"rows": [row]}))
    (tmp_path / "b.json").write_text(json.dumps(row))  # the same run, in its own file
    old = {"run": "seed-2", "task": "t", "zero_variance_groups": [3, 8, 8]}  # 8 groups a step
    (tmp_path / "c.json").write_text(json.dumps({"runs": [old]}))
    runs = flat_stop.runs_on_record(tmp_path)
    assert len(runs) == 2
    k1, k2, _ = flat_stop.replay(runs)
    assert (k2["ended"], k2["skipped_steps"], k2["signal_groups_skipped"]) == (1, 2, 3)
    assert (k1["ended"], k1["skipped_steps"], k1["signal_groups_skipped"]) == (2, 4, 3)
