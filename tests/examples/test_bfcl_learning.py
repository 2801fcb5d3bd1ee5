"""The CI learning test on BFCL: a short run of `examples/bfcl` must raise held-out BFCL
accuracy by a margin that a run without learning does not reach.

The arm: 4 steps of 4 groups x 4 rollouts (one training item per calling category a
step), then greedy BFCL accuracy on the first 30 held-out evaluation items of
simple_python and multiple, before and after (`CI_ARGS`). Its headline is the mean greedy
rise over those two categories. The margin for a host class comes from `bench.learning_bfcl
--tag ci --extra "<CI_ARGS>"` over seeds 1-5 of exactly these arguments (out of sample:
this test runs seed 0): their mean minus 2.33 spreads, the spread being the larger of the
seeds' sd and one run's s.e. The shuffled-reward controls' headline rises sit below it
(docs/bfcl.md#the-ci-learning-test has the table). A host class without its own five
seeds has no margin, and the test says so instead of guessing one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_ARGS = ["--steps", "4", "--groups-per-step", "4", "--eval-categories", "simple_python,multiple", "--eval-modes", "greedy", "--eval-limit", "30"]  # fmt: skip
"""The arm's arguments, and those of the bench runs that set its margins."""
MIN_RISE: dict[str, float] = {}
"""Per host class (`bench.learning.host_key`): the least headline rise the arm accepts."""


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.bfcl
def test_a_short_bfcl_run_makes_the_real_model_better(tmp_path: Path) -> None:
    from art_langgraph.devices import matmul_flags
    from bench.learning import host_key

    host = host_key(matmul_flags())
    if host not in MIN_RISE:
        pytest.skip(f"no margin measured for host class {host} yet (bench.learning_bfcl --tag ci)")
    out = subprocess.run(
        [sys.executable, "-m", "examples.bfcl", *CI_ARGS, "--seed", "0", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["calling_mean_greedy_rise"] >= MIN_RISE[host], result["accuracy"]
