"""The main job (`./scripts/demo.sh`) on the real model, run as a user runs it, cut short.

What a user sees is checked: the script sets up, prints the machine, the estimate and the
first step's pre-flight, evaluates the untrained model, warm-starts on the two-hop task's
demonstrations (the default when scenarios carry them), evaluates before RL and after,
names the evaluations by RL step, prints its report, and the report holds the three
evaluations, RL's paired rise and the warm start's apart. The cut (one warm-start epoch
instead of three, 2 steps of 4 x 4 rollouts, 8 held-out scenarios x 2 episodes) keeps it
to a few minutes: the warm start's three epochs alone took 11 min on a slow 2-core host.

Whether RL learns is not this test's claim: the CI learning test is the BFCL arm
(`tests/examples/test_bfcl_learning.py`), whose margin sits above its controls.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CUT = [
    "--sft-epochs", "1", "--steps", "2", "--groups-per-step", "4", "--eval-samples", "1",
    "--eval-scenarios", "8",
]  # fmt: skip
"""The main job's extra arguments here: the defaults but for the run's length."""


@pytest.mark.slow
def test_the_main_job_runs_as_a_user_sees_it(tmp_path: Path) -> None:
    steps = int(CUT[CUT.index("--steps") + 1])
    out = subprocess.run(
        ["bash", "scripts/demo.sh", *CUT],
        cwd=ROOT,
        env={**os.environ, "ART_DEMO_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=2700,  # a hang guard: 10 min alone on a 2-core host, more beside the rest
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines and any(line.startswith("machine: CPU") for line in lines)
    assert any(line.startswith("estimate: ") for line in lines)
    assert any("RL step 1 pre-flight: " in line for line in lines)
    # the evaluations are named by RL step, as the steps are
    assert any(line.startswith("the untrained model's held-out evaluation: ") for line in lines)
    assert "# " in out.stdout  # the report is printed at the end
    report = json.loads((tmp_path / "mcp/models/demo/report.json").read_text())
    assert any(line.startswith("SFT warm start on 64 demonstrations: ") for line in lines)
    # RL's last adapter is evaluated unless no step trained (a step with one reward in every
    # group carries its adapter forward, and the one evaluated before RL stands for it)
    ran = report["ended_after"] or steps
    if len(report["untrained_steps"]) < ran:
        assert [e["rl_step"] for e in report["evaluations"]] == [0, 0, ran]
        assert any(line.startswith(f"held-out evaluation after RL step {ran}: ") for line in lines)
        assert all(report["paired"][kind]["n"] == 8 for kind in ("greedy", "sampled"))
    else:
        assert [e["rl_step"] for e in report["evaluations"]] == [0, 0]
        assert "held-out not evaluated again: the adapter is step" in out.stdout
    for kind in ("greedy", "sampled"):
        assert report["warm_start"]["all"][kind]["n"] == 8
