"""The examples run as a user runs them (subprocesses), and write what they promise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(module: str, *args: str, timeout: int = 600) -> str:
    """`python -m examples.<module> ARGS` from the repo root; its stdout, once it exits 0."""
    out = subprocess.run(
        [sys.executable, "-m", f"examples.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_langgraph_agent_example(tmp_path: Path) -> None:
    stdout = run_example(
        "langgraph_agent", "--steps", "2", "--group-size", "4", "--out", str(tmp_path)
    )
    assert "held-out" in stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["rows"]) == 2
    png = (tmp_path / "reward_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_server_chat_demo() -> None:
    stdout = run_example("server_chat", "--turns", "2", timeout=300)
    assert "[tiny@0] turn 1" in stdout and "finish=tool_calls" in stdout


@pytest.mark.slow
def test_langgraph_nodes_example(tmp_path: Path) -> None:
    stdout = run_example(
        "langgraph_nodes",
        "--steps",
        "1",
        "--groups-per-step",
        "2",
        "--held-out",
        "4",
        "--out",
        str(tmp_path),
    )
    assert "router (held-out)" in stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["train_nodes"] == ["router", "agent"] and len(report["rows"]) == 2
    for row in report["rows"]:
        assert 0.0 <= row["held_out_router"] <= 1.0 and 0.0 <= row["held_out_agent"] <= 1.0


def swap_in_code() -> str:
    """examples/swap_in.py below its docstring: what the README must show."""
    text = (ROOT / "examples" / "swap_in.py").read_text()
    return text[text.index('"""', 3) + 3 :].strip("\n")


def test_the_readme_shows_the_swap_in_line_for_line() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The swap-in") :]
    start = section.index("```python\n") + 10
    block = section[start : section.index("\n```", start)]
    assert block == swap_in_code()
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) <= 12, f"the swap-in is {len(lines)} lines; the README promises 12 at most"
    assert readme.index("## The swap-in") < readme.index("## The two commands")


@pytest.mark.slow
def test_the_swap_in_runs_as_written(tmp_path: Path) -> None:
    """The file itself, from a folder of its own (its model folder, `.art/`, lands there):
    one GRPO step on the real preset, which then serves step 1."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "swap_in.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("step=1 "), out.stdout[-2000:]
    assert (tmp_path / ".art" / "readme" / "models" / "agent").is_dir()
