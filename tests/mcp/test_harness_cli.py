"""`art-mcp train` end to end, as a user runs it: a subprocess, the bundled stdio server, a reward module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from art_mcp.scenarios import load_scenarios, split_scenarios
from art_mcp.warm_start import probe_size, probe_split

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _train(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "art_mcp.cli", "train",
            "--server", "python -m examples.mcp_server.server",
            "--scenarios", "examples/mcp_server/scenarios.jsonl",
            "--reward", "examples.mcp_server.tasks:score",
            "--path", str(tmp_path), "--group-size", "2", "--groups-per-step", "2",
            "--sft-epochs", "2", "--max-tokens", "48", "--val-fraction", "0.1", "--eval-every", "1",
            "--tool-choice", "required", "--max-turns", "2", "--base-model", "tiny", *extra,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_one_step_end_to_end_then_resume_without_a_name(tmp_path: Path) -> None:
    # a reward that trains the step (tests/mcp/alternating.py), so its adapter is evaluated
    alternating = ("--reward", "tests.mcp.alternating:score")
    first = _train(tmp_path, "--steps", "1", "--eval-scenarios", "2", *alternating)
    assert first.returncode == 0, first.stderr[-3000:]
    # the warm start trains on the train split only: a held-out scenario is never seen
    scen = load_scenarios(ROOT / "examples/mcp_server/scenarios.jsonl")
    train, _ = split_scenarios(scen, 0.1, 0)
    # ... less the probe's scenarios (whole entities), run greedily after the first epoch:
    # the alternating reward scores each one's first episode 1, so the probe ends it
    taught, probe = probe_split(train, probe_size(len(train), 8), 0)
    assert f"SFT warm start on {len(taught)} demonstrations: epoch 1 of 2" in first.stdout
    n = len(probe)
    assert f"probe after epoch 1: {n} of {n} held-back training scenarios" in first.stdout
    assert "the warm start ends" in first.stdout and "epoch 2 of 2" not in first.stdout
    (folder,) = (tmp_path / "mcp" / "models").iterdir()  # no --name: a stable default name
    assert f"model name {folder.name}" in first.stdout
    report = json.loads((folder / "report.json").read_text())
    # after the SFT epoch (step 1), after one GRPO step
    assert [r["step"] for r in report["rows"]] == [1.0, 2.0]
    assert report["val_reward_before"] is not None and (folder / "report.md").exists()
    assert (folder / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["0001", "0002"]
    # --max-turns 2: no rollout calls the model a third time
    files = sorted((folder / "trajectories" / "train").iterdir())
    groups = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    calls = [
        sum(c["type"] == "llm_call" for c in t["calls"]) for g in groups for t in g["trajectories"]
    ]
    assert calls and max(calls) <= 2, calls
    # the untrained model is evaluated first, then after the warm start, then after RL
    assert [e["rl_step"] for e in report["evaluations"]] == [0, 0, 1]
    assert all(len(v) == 2 for v in report["evaluations"][0]["sampled"].values())  # the default
    # --eval-scenarios 2: every evaluation runs the same two held-out scenarios
    evaluated = [sorted(e["greedy"]) for e in report["evaluations"]]
    assert len(evaluated[0]) == 2 and all(ids == evaluated[0] for ids in evaluated)
    assert "(2 evaluated)" in first.stdout
    # a restart continues from the last checkpoint, without a second warm start
    second = _train(tmp_path, "--steps", "2", "--eval-scenarios", "2", *alternating)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "SFT warm start on" not in second.stdout
    assert [p.name for p in (tmp_path / "mcp" / "models").iterdir()] == [folder.name]
    # the untrained model's held-out reward survives the restart (rows hold nulls)
    assert json.loads((folder / "report.json").read_text())["val_reward_untrained"] is not None
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["0001", "0002", "0003"]


def test_a_run_told_not_to_evaluate_the_untrained_model_starts_after_the_warm_start(
    tmp_path: Path,
) -> None:
    # a reward that trains the step (tests/mcp/alternating.py), so its adapter is evaluated
    run = _train(
        tmp_path, "--steps", "1", "--eval-scenarios", "2", "--eval-untrained", "false",
        "--reward", "tests.mcp.alternating:score",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "untrained: held-out" not in run.stdout
    assert "after the SFT warm start, before RL: held-out" in run.stdout
    (folder,) = (tmp_path / "mcp" / "models").iterdir()
    report = json.loads((folder / "report.json").read_text())
    # the warm start's checkpoint (step 1), then RL step 1's: no evaluation of step 0
    assert [(e["step"], e["rl_step"]) for e in report["evaluations"]] == [(1, 0), (2, 1)]
    assert report["val_reward_untrained"] is None and report["warm_start"] == {}
    assert "before RL -> last" in (folder / "report.md").read_text()


def test_help_documents_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "art_mcp.cli", "train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    from art_mcp.config import HarnessConfig

    for name in HarnessConfig.model_fields:
        assert "--" + name.replace("_", "-") in out.stdout


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "art_mcp.cli", "train", "--server", "python -m examples.mcp_server.server", "--path", str(tmp_path), "--base-model", "tiny"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2 and "reward function" in out.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--scenarios", "missing.jsonl"], "no scenarios file at missing.jsonl"),
        (["--scenarios", "EMPTY"], "holds no scenarios"),
        (["--reward", "no_such_module:score"], "cannot import the reward module"),
        (["--reward", "examples.mcp_server.tasks:nothing"], "has no callable 'nothing'"),
        (["--env", "NOEQUALS"], "--env takes KEY=VALUE"),
        (
            ["--base-model", "smollm2"],
            "unknown base model 'smollm2': give a preset (tiny, smollm2-135m)",
        ),
        (
            ["--server-per", "rollout", "--server", "http://127.0.0.1:9/mcp"],
            "give the server as a command",
        ),
        (["--allow-tools", "add,nope"], "has no tool named 'nope'"),
    ],
)
def test_bad_inputs_are_one_line_errors_not_tracebacks(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = [str(empty) if a == "EMPTY" else a for a in args]
    base = {"--scenarios": "examples/mcp_server/scenarios.jsonl", "--reward": "examples.mcp_server.tasks:score"}  # fmt: skip
    base["--server"] = "python -m examples.mcp_server.server"
    base["--base-model"] = "tiny"
    for flag, value in base.items():
        if flag not in args:
            args += [flag, value]
    out = subprocess.run(
        [sys.executable, "-m", "art_mcp.cli", "train", "--path", str(tmp_path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "mcp" / "models").exists()  # nothing started, nothing written


def test_env_reaches_a_stdio_server(tmp_path: Path) -> None:
    out = _train(
        tmp_path, "--env", "ART_MCP_TEST_TOOLS=1", "--steps", "0", "--sft-epochs", "0",
        "--eval-scenarios", "2",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "6 tools from" in out.stdout  # `wait` and `crash` exist only with the variable
    assert "stderr goes to" in out.stdout


def test_scenarios_command_writes_nothing_when_no_task_reaches_a_tool(tmp_path: Path) -> None:
    """`art-mcp scenarios` end to end on the tiny (random) preset: its tasks name nothing
    the tools reach, so they are dropped, said, and no file is written. float32 pinned:
    what random weights write depends on the dtype, and in bfloat16 a task happened to
    name a tool's word."""
    out = tmp_path / "scen.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "art_mcp.cli", "scenarios", "--server", "python -m examples.mcp_server.server",
         "-n", "2", "--out", str(out), "--path", str(tmp_path), "--instructions", "Ask about capitals.",
         "--base-model", "tiny", "--engine-dtype", "float32"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "dropped" in run.stdout and "name nothing the tools can reach" in run.stdout
    assert "gave no usable scenarios" in run.stderr and "Traceback" not in run.stderr
    assert not out.exists()
