"""The main job (`./scripts/demo.sh`) on the real model, run as a user runs it, in at most 10 minutes.

What a user sees is checked: the script sets up, prints the machine, the estimate and the
first step's pre-flight, evaluates before and after, prints its report, and held-out
success rises by at least a margin set over 5 seeds of exactly this arm's arguments. The
arm depends on the host class (AMX or AVX512-BF16: bfloat16, 5 steps; AVX2: 4 smaller
steps); the runs behind each margin, and why each arm is what it is:
docs/results.md#the-ci-learning-test.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI_ARGS = ["--steps", "4", "--groups-per-step", "4", "--eval-samples", "1", "--eval-scenarios", "16"]  # fmt: skip
"""The arguments of the AVX2 arm and of its bench runs (`bench.learning --extra`)."""
MIN_RISE_AVX2 = -0.15
"""The least pooled paired rise the AVX2 arm accepts (docs/results.md: mean - 2.33 sd of 5 seeds, -0.154)."""
AMX_ARGS = ["--engine-dtype", "bfloat16", "--steps", "5", "--eval-samples", "1", "--eval-scenarios", "32"]  # fmt: skip
"""The arguments of the arm for a CPU with AMX or AVX512-BF16, and of its bench runs."""
MIN_RISE_AMX = 0.14
"""The least pooled paired rise the AMX arm accepts (docs/results.md: mean - 2.33 x the evaluation s.e., +0.144)."""


def arm() -> tuple[list[str], float]:
    """This host's arm: the demo's extra arguments and the least rise."""
    from art_langgraph.runtime.devices import cpu_has_fast_bf16

    return (AMX_ARGS, MIN_RISE_AMX) if cpu_has_fast_bf16() else (CI_ARGS, MIN_RISE_AVX2)


@pytest.mark.slow
@pytest.mark.serial
def test_the_main_job_makes_the_real_model_better(tmp_path: Path) -> None:
    args, min_rise = arm()
    steps = int(args[args.index("--steps") + 1])
    out = subprocess.run(
        ["bash", "scripts/demo.sh", *args],
        cwd=ROOT,
        env={**os.environ, "ART_DEMO_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines and any(line.startswith("machine: CPU") for line in lines)
    assert any(line.startswith("estimate: ") for line in lines)
    assert any("RL step 1 pre-flight: " in line for line in lines)
    # the evaluations are named by RL step, as the steps are
    assert any(line.startswith("the untrained model's held-out evaluation: ") for line in lines)
    assert any(line.startswith(f"held-out evaluation after RL step {steps}: ") for line in lines)
    assert "# " in out.stdout  # the report is printed at the end
    report = json.loads((tmp_path / "mcp/models/demo/report.json").read_text())
    assert [e["rl_step"] for e in report["evaluations"]] == [0, steps]
    paired = report["paired"]
    rise = (paired["greedy"]["rise"] + paired["sampled"]["rise"]) / 2
    assert rise >= min_rise, (paired, out.stdout[-3000:])
