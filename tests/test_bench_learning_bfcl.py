"""bench.learning_bfcl's table: runs pool only with the same code and arguments, and a
table with controls but no seed yet shows the controls and claims no rise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import learning_bfcl

CATS = ("simple_python/greedy", "multiple/greedy", "parallel/greedy", "parallel_multiple/greedy")


def _run(seed: int, control: bool, rise: float, code: str = "abc") -> dict[str, object]:
    accuracy = {c: {"before": 0.0, "after": rise, "rise": rise, "se": 0.01} for c in CATS}
    accuracy["irrelevance/greedy"] = {"before": 0.5, "after": 0.4, "rise": -0.1, "se": 0.05}
    accuracy["irrelevance/greedy_auto"] = {"before": 0.9, "after": 1.0, "rise": 0.1, "se": 0.05}
    return {
        "commit": "c0ffee",
        "code": code,
        "args": {"steps": 6, "seed": seed, "control": control, "out": f"/x/{seed}"},
        "cpu_flags": "avx2",
        "control": control,
        "wall_s": 600.0,
        "peak_rss_gib": 3.0,
        "accuracy": accuracy,
        "calling_mean_greedy_rise": rise,
    }


def _write(folder: Path, name: str, run: dict[str, object]) -> None:
    (folder / f"bfcl_avx2_t_{name}.json").write_text(json.dumps(run))


def test_a_control_alone_is_shown_and_no_rise_is_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learning_bfcl, "RESULTS", tmp_path)
    _write(tmp_path, "control1", _run(1, True, -0.01))
    table = learning_bfcl.combine("avx2", "t")
    assert "0 seed(s) and 1 control(s)" in table
    assert "| simple_python/greedy | 0.00 | -0.01 | - | -0.01 |" in table
    assert "no seed yet (seeds); -0.01 (controls)" in table
    _write(tmp_path, "seed1", _run(1, False, 0.2))
    table = learning_bfcl.combine("avx2", "t")
    assert "| simple_python/greedy | 0.00 | 0.20 | +0.20 | -0.01 |" in table


def test_runs_of_other_code_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(learning_bfcl, "RESULTS", tmp_path)
    _write(tmp_path, "seed0", _run(0, False, 0.1, code="old"))
    _write(tmp_path, "control1", _run(1, True, 0.0, code="new"))
    with pytest.raises(SystemExit, match="different code or arguments"):
        learning_bfcl.combine("avx2", "t")


def test_the_readme_rows_claim_the_seeds_and_show_irrelevance_under_both_choices() -> None:
    seeds, controls = [_run(1, False, 0.2), _run(2, False, 0.1)], [_run(1, True, 0.0)]
    rows = learning_bfcl.headline("avx2", seeds, controls).splitlines()
    assert (
        rows[2]
        == "| 4 calling categories' mean, RL, 2 run(s) | 0.00 | 0.15 | **+0.15** ± 0.07 sd |"
    )
    assert rows[3].startswith(
        "| 4 calling categories' mean, control (shuffled rewards), 1 run(s) |"
    )
    assert rows[4].startswith(
        '| irrelevance under "required" (declining is the pass), RL, 2 run(s) | 0.50 | 0.40 |'
    )
    assert rows[5].startswith(
        '| irrelevance under "auto" (no call is the pass), RL, 2 run(s) | 0.90 | 1.00 |'
    )
    assert "Per seed: +0.20, +0.10." in rows[7]
