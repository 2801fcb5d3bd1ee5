"""`bench.bfcl_mix`'s table: arms pooled over their seeds; runs of different code or
arguments refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bfcl_mix import ARMS, combine


def _result(folder: Path, arm: str, seed: int, rise: float, irr_after: float, code: str) -> None:
    folder.mkdir(parents=True)
    result = {
        "commit": "abc1234",
        "code": code,
        "cpu_flags": "amx_bf16,avx512_bf16,avx512f,avx2",
        "allocator": "tcmalloc",
        "wall_s": 600.0,
        "args": {"seed": seed, "steps": 6, "train_categories": ",".join(ARMS[arm])},
        "calling_mean_greedy_rise": rise,
        "accuracy": {"irrelevance/greedy": {"before": 0.5, "after": irr_after}},
        "per_item": {},
    }
    (folder / "result.json").write_text(json.dumps(result))


def test_arms_pool_over_their_seeds_and_other_code_is_refused(tmp_path: Path) -> None:
    runs, results = tmp_path / "runs", tmp_path / "results"
    results.mkdir()
    _result(runs / "all-s1", "all", 1, 0.10, 0.25, "c0de")
    _result(runs / "all-s2", "all", 2, 0.20, 0.75, "c0de")
    _result(runs / "half-s1", "half", 1, 0.05, 0.5, "c0de")
    table = combine(["all", "half"], [1, 2], runs, "t", results)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert "| 2 | +0.15 ± 0.07 | 0.50 -> 0.50 |" in rows["all"]
    assert "s1: +0.10, 0.25; s2: +0.20, 0.75" in rows["all"]
    assert "| 1 | +0.05 | 0.50 -> 0.50 |" in rows["half"]
    saved = json.loads((results / "bfcl_amx_mix_t.json").read_text())
    assert saved["arms"]["half"] == {
        "train_categories": list(ARMS["half"]),
        "train_config": {},
        "example_flags": [],
    }
    assert "per_item" not in saved["runs"]["all"][0]
    assert "6 steps" in table
    _result(runs / "half-s2", "half", 2, 0.05, 0.5, "other")
    with pytest.raises(SystemExit, match="different code"):
        combine(["all", "half"], [1, 2], runs, "t", results)
    longer = json.loads((runs / "half-s2" / "result.json").read_text())
    longer["code"], longer["args"]["steps"] = "c0de", 12
    (runs / "half-s2" / "result.json").write_text(json.dumps(longer))
    with pytest.raises(SystemExit, match="different arguments"):
        combine(["all", "half"], [1, 2], runs, "t", results)


def test_a_runs_earlier_evaluations_are_rows_of_their_own(tmp_path: Path) -> None:
    runs, results = tmp_path / "runs", tmp_path / "results"
    results.mkdir()
    for seed, (mid, end) in ((1, (0.10, 0.30)), (2, (0.20, 0.10))):
        _result(runs / f"noparallel-s{seed}", "noparallel", seed, end, 0.5, "c0de")
        path = runs / f"noparallel-s{seed}" / "result.json"
        r = json.loads(path.read_text())
        r["args"].update(steps=12, eval_at=[6])
        r["at_steps"] = {
            "6": {
                "calling_mean_greedy_rise": mid,
                "accuracy": {"irrelevance/greedy": {"before": 0.5, "after": 0.75}},
            }
        }
        path.write_text(json.dumps(r))
    table = combine(["noparallel"], [1, 2], runs, "t", results)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert (
        "| 2 | +0.15 ± 0.07 | 0.50 -> 0.75 | s1: +0.10, 0.75; s2: +0.20, 0.75 | - |"
        in (rows["noparallel, after 6 steps"])
    )
    assert "| 2 | +0.20 ± 0.14 | 0.50 -> 0.50 |" in rows["noparallel"]
    assert "12 steps" in table


def test_an_arm_that_changes_train_config_passes_a_valid_one_to_the_example() -> None:
    from bench.bfcl_mix import TRAIN_CONFIGS
    from examples.bfcl.app import _check_args, parser

    for arm, config in TRAIN_CONFIGS.items():
        assert arm in ARMS
        args = _check_args(parser().parse_args(["--train-config", json.dumps(config)]))
        assert json.loads(args.train_config) == config
    with pytest.raises(SystemExit, match="--train-config"):
        _check_args(parser().parse_args(["--train-config", '{"flat_groups": "sometimes"}']))


def test_an_arm_that_changes_the_examples_reward_passes_a_valid_flag() -> None:
    from bench.bfcl_mix import EXAMPLE_FLAGS
    from examples.bfcl.app import _check_args, parser

    for arm, flags in EXAMPLE_FLAGS.items():
        assert arm in ARMS
        args = _check_args(parser().parse_args(flags))
        assert args.decline_reward == flags[-1] != "any"
