"""The main job (`./scripts/demo.sh`), run as a user runs it, cut to one small step.

The demo trains the real SmolLM2-135M-Instruct with the library's defaults (about 20
minutes on 2 CPU cores; its learning is measured over seeds by `bench.learning`, see
docs/results.md). Here it runs with extra arguments that keep it to a few minutes (one
step of 2 groups, 4 held-out scenarios), which `demo.sh` passes on to `art-mcp train`:
what is checked is that the script sets up, trains the real model, evaluates it before
and after, and prints its report, with the machine and the estimate on the way.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_main_job_runs_end_to_end_on_the_real_model(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            "bash", "scripts/demo.sh", "--steps", "1", "--groups-per-step", "2",
            "--eval-scenarios", "4", "--eval-samples", "1",
        ],
        cwd=ROOT,
        env={**os.environ, "ART_DEMO_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=1200,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "mcp/models/demo/report.json").read_text())
    assert [e["rl_step"] for e in report["evaluations"]] == [0, 1]
    lines = out.stdout.splitlines()
    assert lines and any(line.startswith("machine: CPU") for line in lines)
    assert any(line.startswith("estimate: ") for line in lines)
    assert any("RL step 1 pre-flight: " in line for line in lines)
    # the evaluations are named by RL step, as the steps are
    assert any(line.startswith("the untrained model's held-out evaluation: ") for line in lines)
    assert any(line.startswith("held-out evaluation after RL step 1: ") for line in lines)
    assert "# " in out.stdout  # the report is printed at the end
