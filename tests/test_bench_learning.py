"""`bench.learning`'s runs end with the bench: `run_watched` returns a run's exit code and
peak RSS, a run dies with a bench that was SIGKILLed (no `finally` runs then), and
`combine` never pools two commits' runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in "ZX"


def test_a_run_reports_its_exit_code_and_peak(tmp_path: Path) -> None:
    from bench.learning import run_watched

    code = "import sys, time; x = bytearray(80 << 20); time.sleep(2.5); sys.exit(3)"
    rc, peak = run_watched("run", [sys.executable, "-c", code], tmp_path / "run.log")
    assert rc == 3
    assert 80 < peak < 400, peak  # the run's 80 MiB and its Python, not the watchdog's too


def test_a_run_dies_with_a_killed_bench(tmp_path: Path) -> None:
    pid_file = tmp_path / "run.pid"
    run = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    bench = (
        "import sys; from pathlib import Path; from bench.learning import run_watched; "
        f"run_watched('run', [sys.executable, '-c', {run!r}], Path({str(tmp_path / 'run.log')!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", bench], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        pid = int(pid_file.read_text())
        assert _alive(pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30  # the watchdog: SIGTERM, then SIGKILL after 10 s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid), "the run outlived the bench"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_summary_breaks_held_out_success_down_by_slice() -> None:
    from bench.learning import slice_table

    p = {"before": 0.25, "after": 0.75, "rise": 0.5, "se": 0.1, "n": 8.0}
    rows = [{"run": "seed-0", "slices": {"wording unseen": {"sampled": p}}}, {"run": "control-0"}]
    text = slice_table(rows)
    assert "| seed-0 | 0.25 -> 0.75 (+0.50), n=8 |" in text and "| control-0 | - |" in text
    assert slice_table([{"run": "seed-0", "slices": {}}]) == ""


def test_a_validation_run_never_sees_the_held_out_scenarios(tmp_path: Path) -> None:
    from art_mcp.scenarios import load_scenarios
    from bench.learning import ROOT, TASKS, task_args, validation_file

    for task in TASKS:
        held_out = {
            s.id
            for s in load_scenarios(ROOT / TASKS[task][1] / "scenarios.jsonl")
            if s.split == "val"
        }
        path = validation_file(task, tmp_path)
        carved = load_scenarios(path)
        assert held_out.isdisjoint(s.id for s in carved)
        assert {s.split for s in carved} == {"train", "val"}
        assert task_args(task, path)[3] == str(path)


def test_held_out_success_is_drawn_per_step_with_the_control_beside(tmp_path: Path) -> None:
    from bench import learning

    rows = [
        {"control": False, "success_curve": [[0, 0.1], [3, 0.5], [6, 0.9]]},
        {"control": False, "success_curve": [[0, 0.2], [3, 0.4], [6, 0.8]]},
        {"control": True, "success_curve": [[0, 0.1], [6, 0.1]]},
    ]
    real = learning.ROOT
    (tmp_path / "docs").mkdir()
    learning.ROOT = tmp_path
    try:
        assert learning._success_plot(rows, "org", "_amx")
        assert (tmp_path / "docs" / "learning_success_org_amx.png").stat().st_size > 1000
        assert not learning._success_plot([{"control": False}], "org")
    finally:
        learning.ROOT = real


def test_a_task_s_evaluation_flags_keep_its_runs_among_the_defaults(tmp_path: Path) -> None:
    """The org chart's runs evaluate more scenarios (`TASK_EVAL`): they pool as runs of the
    defaults; a run with any other flag pools only under its tag."""
    from bench import learning

    assert learning.of_the_defaults("org", learning.TASK_EVAL["org"])
    assert learning.of_the_defaults("capitals", [])
    assert not learning.of_the_defaults("capitals", learning.TASK_EVAL["org"])
    assert not learning.of_the_defaults("org", ["--learning-rate", "1e-4"])
    machine = "x86_64, 2 cores, CPU flags: avx2"
    for name, extra in (("a", learning.TASK_EVAL["org"]), ("b", ["--learning-rate", "1e-4"])):
        part = {"machine": machine, "args": [], "extra": extra}
        part["rows"] = [{"run": f"seed-{name}", "control": False, "seed": 1}]
        (tmp_path / f"learning_org_{name}.json").write_text(json.dumps(part))
    real = learning.RESULTS
    learning.RESULTS = tmp_path
    try:
        (data,) = learning.combine("org")
        assert [r["run"] for r in data["rows"]] == ["seed-a"]
    finally:
        learning.RESULTS = real


def test_warm_started_runs_get_the_warm_start_s_columns() -> None:
    """Runs that warm-started show untrained | after the warm start | after RL with RL's own
    rise, per slice, and the calls per solved episode beside."""
    from bench import learning

    def p(before: float, after: float) -> dict[str, float]:
        return {"before": before, "after": after, "rise": after - before, "se": 0.1, "n": 8.0}

    def row(seed: int, control: bool, rl_after: float) -> dict:
        return {
            "run": f"{'control' if control else 'seed'}-{seed}",
            "seed": seed,
            "control": control,
            "train_reward": [0.1] * 6,
            "wall_s": 600.0,
            "peak_rss_mib": 3000.0,
            "paired": {"sampled": p(0.2, rl_after), "greedy": p(0.2, rl_after)},
            "slices": {"two-hop": {"sampled": p(0.3, rl_after), "greedy": p(0.3, rl_after)}},
            "warm_start": {
                "all": {"sampled": p(0.0, 0.2), "greedy": p(0.1, 0.2)},
                "two-hop": {"sampled": p(0.0, 0.3), "greedy": p(0.0, 0.3)},
            },
            "calls": {"two-hop": {"before": 2.5, "after": 2.0, "repeated_before": 0.5,
                                  "repeated_after": 0.0, "solved_before": 3, "solved_after": 6}},
        }  # fmt: skip

    rows = [row(1, False, 0.6), row(2, False, 0.8), row(1, True, 0.3)]
    data = {"machine": "x86_64, 2 cores, CPU flags: avx2", "rows": rows}
    text = learning.headline([data])
    assert "| untrained | after the warm start | after 6 RL steps | RL's rise |" in text
    assert (
        "| AVX2, fp32 | two-hop, sampled at T=1, RL, 2 seed(s) | 0.00 | 0.30 | 0.70 | **+0.40** ± 0.14 sd |"
        in text
    )
    assert (
        "| AVX2, fp32 | two-hop, sampled at T=1, control (shuffled rewards), 1 run(s) | 0.00 | 0.30 | 0.30 | **+0.00** (one run) |"
        in text
    )
    warm = learning.warm_table(rows)
    assert (
        "| seed-1 | 0.00 -> 0.30 -> 0.60 | 0.00 -> 0.20 -> 0.60 | 2.50 (0.50) -> 2.00 (0.00) | - |"
        in warm
    )
    assert learning.warm_table([{"warm_start": {}}]) == ""


def test_a_warm_start_arm_keeps_its_demonstrations_only(tmp_path: Path) -> None:
    """bench.warm_start's arm of n demonstrations: n training scenarios of the validation
    slice carry one (half one-hop, half two-hop, made by the task), no other does."""
    from art_mcp.scenarios import load_scenarios
    from bench.warm_start import slice_file

    out = load_scenarios(slice_file(tmp_path, 16))
    shown = [s for s in out if s.demonstration is not None]
    assert len(shown) == 16 and all(s.split == "train" for s in shown)
    assert sum(s.metadata["slice"] == "two-hop" for s in shown) == 8
    assert all(s.answer in json.dumps(s.demonstration[-1]) for s in shown)


def test_combine_pools_one_commits_runs_and_refuses_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench.learning as learning

    monkeypatch.setattr(learning, "RESULTS", tmp_path)
    machine = "x86_64, 2 cores, CPU flags: avx2"

    def part(tag: str, run: str, commit: str) -> None:
        data = {"machine": machine, "args": [], "extra": [],
                "rows": [{"run": run, "seed": 1, "control": False, "commit": commit}]}  # fmt: skip
        (tmp_path / f"learning_org_{tag}.json").write_text(json.dumps(data))

    part("a", "seed-1", "abc1234")
    part("b", "control-1", "abc1234")
    [data] = learning.combine("org")
    assert [r["run"] for r in data["rows"]] == ["seed-1", "control-1"]
    part("c", "seed-2", "def5678")  # a later commit's run beside them
    with pytest.raises(SystemExit, match="different commits"):
        learning.combine("org")
