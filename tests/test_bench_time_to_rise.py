"""bench.time_to_rise: a real cold `art-mcp train` run from a checkout's own folder, timed
phase by phase from its own lines, and the pooled verdict on wall time and rise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import time_to_rise as ttr

ROOT = Path(__file__).resolve().parents[1]


def test_a_cold_run_is_timed_phase_by_phase_from_its_own_lines(tmp_path: Path) -> None:
    tiny = ("--base-model", "tiny", "--steps", "2", "--groups-per-step", "2", "--group-size", "2")
    tiny += ("--eval-scenarios", "2", "--eval-samples", "1", "--sft-epochs", "0")
    row = ttr.run_one(ROOT, "ours", "capitals", 0, tmp_path, extra=tiny)
    ph = row["phases"]
    # the untrained model's (no warm start: it is also RL's baseline), and the last step's
    # unless no step trained (the adapter is then the one evaluated)
    assert len(row["zero_variance_groups"]) == len(row["groups"]) == 2
    trained = any(z < g for z, g in zip(row["zero_variance_groups"], row["groups"], strict=True))
    assert ph["evaluations"] == 1 + trained and ph["steps"] == 2
    assert all(ph[k] >= 0 for k in ttr.PHASES), ph
    assert sum(ph[k] for k in ttr.PHASES) == pytest.approx(row["wall_s"])
    assert row["rise"] is not None and -1 <= row["rise"] <= 1 and row["rl_rise"] == row["rise"]
    assert row["commit"] == ttr.stamp(ROOT) and row["task_files"] == ttr.task_digest(
        ROOT, "capitals"
    )
    assert json.loads((tmp_path / "ours-s0.json").read_text())["run"] == "ours-s0"
    assert "--base-model tiny" in (tmp_path / "ours-s0.log").read_text()


def test_the_phases_read_the_harness_lines() -> None:
    log = "\n".join(
        [
            "the untrained model's held-out evaluation: 72 episodes in 120 s; engine: ...",
            "SFT warm start on 46 demonstrations: 2 of 3 epochs in 40 s (stopped at loss "
            "0.01), loss 0.71 -> 0.00; epochs' tail losses 0.03, 0.01",
            "held-out evaluation after the SFT warm start, before RL: 72 episodes in 80 s",
            "RL step 1: 32 of 32 rollouts in 34 s; engine: 75k prompt tokens; training",
            "RL step 1: trained 1 micro-batches (2617 tokens) in 70 s",
            "RL step 2: 32 of 32 rollouts (4 errors) in 30 s; training",
            "RL step 2: trained 2 micro-batches (3000 tokens) in 60 s",
            "held-out evaluation after RL step 2: 72 episodes in 90 s",
        ]
    )
    ph = ttr.phases(log, 500.0)
    assert ph["untrained_eval_s"] == 120 and ph["evals_s"] == 170
    assert ph["rollouts_s"] == 64 and ph["training_s"] == 130 and ph["warm_start_s"] == 40
    assert ph["other_s"] == 500 - 120 - 170 - 64 - 130 - 40
    assert ph["evaluations"] == 3 and ph["steps"] == 2


def test_a_probed_warm_start_counts_its_epochs_and_probes() -> None:
    """The lines the harness prints for a probed warm start (made by its own functions):
    each epoch's and each probe's seconds go to the warm start."""
    from art_mcp.progress import warm_start_line
    from art_mcp.warm_start import probe_line

    m = {"sft_epochs": 1.0, "sft_seconds": 200.0, "sft_loss_first": 0.5, "sft_loss_last": 0.0}
    m["sft_epoch1_tail_loss"] = 0.0
    log = "\n".join(
        [
            warm_start_line(120, 3, m, epoch=1),
            probe_line(1, 5, 8, 14.0, False),
            warm_start_line(120, 3, {**m, "sft_seconds": 190.0}, epoch=2),
            probe_line(2, 8, 8, 11.0, True),
        ]
    )
    assert ttr.phases(log, 500.0)["warm_start_s"] == 200 + 14 + 190 + 11


def _row(label: str, seed: int, wall: float, rise: float) -> dict[str, object]:
    ph = dict.fromkeys(ttr.PHASES, wall / 5)
    return {
        "run": f"{label}-s{seed}", "label": label, "commit": "abc1234", "task": "capitals",
        "task_files": "t", "seed": seed, "cpu_flags": "avx2", "wall_s": wall,
        "peak_rss_mib": 3000.0, "phases": ph, "rise": rise, "rl_rise": rise / 2,
    }  # fmt: skip


def test_the_verdict_pairs_seeds_and_holds_the_rise() -> None:
    rows = [_row("ref", s, 600.0, 0.5) for s in (1, 2)]
    rows += [_row("ours", 1, 300.0, 0.46), _row("ours", 2, 360.0, 0.46)]
    text, verdict = ttr.table(rows)
    assert verdict["ours"]["wall_ratio"] == pytest.approx(0.55) and verdict["held"] is True
    assert text.index("| ref ") < text.index("| ours ") and "0.50, 0.60" in text
    rows[-1]["rise"] = rows[-2]["rise"] = 0.44
    assert ttr.table(rows)[1]["held"] is False  # 0.06 below the reference's


def test_one_run_a_checkout_has_no_spread() -> None:
    text, _ = ttr.table([_row("ref", 1, 600.0, 0.5), _row("ours", 1, 300.0, 0.46)])
    assert "nan" not in text and "| +0.46 (+0.46) |" in text
    alone, _ = ttr.table([_row("ours", 1, 300.0, 0.46)])  # no reference: no ratio
    assert "nan" not in alone and "| 5.0 (5.0) | - |" in alone


def test_runs_of_different_task_files_are_never_pooled(tmp_path: Path) -> None:
    for r in (_row("ref", 1, 600.0, 0.5), {**_row("ours", 1, 300.0, 0.5), "task_files": "u"}):
        (tmp_path / f"{r['run']}.json").write_text(json.dumps(r))
    with pytest.raises(SystemExit, match="task files differ"):
        ttr.combine(tmp_path, "")


def test_the_table_says_how_the_pooled_runs_were_ordered() -> None:
    rows = [_row("ref", 1, 600.0, 0.5), _row("ours", 1, 300.0, 0.46)]
    rows += [_row("ref", 2, 600.0, 0.5), _row("ours", 2, 300.0, 0.46)]
    assert "the order not recorded" in ttr.table(rows)[0]  # runs from before start times
    for i, r in enumerate(rows):
        r["started"] = 100.0 * i
    assert "the order alternating seed by seed" in ttr.table(rows)[0]  # ref, ours, ref, ours
    rows[2]["started"], rows[3]["started"] = 300.0, 200.0  # the bench's own: ref, ours, ours, ref
    assert "the order alternating seed by seed" in ttr.table(rows)[0]
    rows[2]["started"], rows[3]["started"] = 200.0, 300.0
    rows[1]["started"], rows[2]["started"] = 200.0, 100.0  # ref, ref, ours, ours
    text = ttr.table(rows)[0]
    assert "not alternating: ref-s1, ref-s2, ours-s1, ours-s2" in text
    assert "alternating seed by seed" not in text
