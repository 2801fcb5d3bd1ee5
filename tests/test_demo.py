"""The main job (`./scripts/demo.sh`), run as a user runs it: the trained agent beats the untrained one.

It trains the tiny preset over the bundled MCP server (untrained evaluation, SFT warm
start, 30 GRPO steps, greedy held-out evaluation every 5 steps) into a temporary folder;
about 2.5-3 minutes on 2 CPU cores.

What is asserted, and why this margin. Measured over seeds 1-5 (`--seed`, which changes
the split and the step order) on this machine kind, one after another on fresh clones of
one commit, 2026-11-24; held-out reward:

| seed | untrained | RL step 0 (after SFT) | best after RL | last |
|---:|---:|---:|---:|---:|
| 0 (default) | 0.11 | 0.71 | 0.79 | 0.79 |
| 1 | 0.16 | 0.37 | 0.40 | 0.37 |
| 2 | 0.10 | 0.58 | 0.65 | 0.59 |
| 3 | 0.12 | 0.54 | 0.56 | 0.44 |
| 4 | 0.14 | 0.34 | 0.38 | 0.38 |
| 5 | 0.12 | 0.61 | 0.65 | 0.58 |

The trained agent's last held-out reward beats the untrained model's by 0.21 to 0.49
over seeds 1-5 (0.68 for seed 0, which this test runs; the day before, with the trainer
not yet sharing prompts, 0.18 to 0.49), so the test asks for 0.15. RL's own contribution
on the tiny model (last minus step 0) ranged from -0.10 to +0.08: it is printed in the
report, not asserted. Another machine of this
kind once reached 0.85 after SFT alone, which is why a rise *during RL* cannot be the
assertion here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_main_job_beats_the_untrained_model(tmp_path: Path) -> None:
    out = subprocess.run(
        ["bash", "scripts/demo.sh"],
        cwd=ROOT,
        env={**os.environ, "ART_DEMO_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "mcp/models/demo/report.json").read_text())
    # rows without an evaluation hold NaN, written to JSON as null
    vals = [r["val_reward"] for r in report["rows"] if r["val_reward"] is not None]
    assert len(vals) == 7  # RL step 0, then every 5 of 30 steps
    assert [r["rl_step"] for r in report["rows"]] == list(range(31))
    untrained, last = report["val_reward_untrained"], report["val_reward_after"]
    assert last - untrained >= 0.15, f"untrained {untrained:.2f}, held-out {vals}: no clear gain"
    assert "RL's own contribution" in out.stdout  # the report is printed at the end
