"""bench.warm_stop: a warm-start-only run's record (its epochs' tail losses, from the
backend's own history line) and the table's stop-loss rule, by hand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from art_mcp.scenarios import load_scenarios, save_scenarios
from bench import warm_stop
from bench.learning import run_one, validation_file

ROOT = Path(__file__).resolve().parents[1]


def test_the_rule_stops_at_the_first_epoch_at_or_under_the_loss() -> None:
    assert warm_stop.stop_epoch([0.2, 0.04, 0.01], 0.05) == 2
    assert warm_stop.stop_epoch([0.2, 0.04, 0.01], 0.2) == 2  # never after the first
    assert warm_stop.stop_epoch([0.2, 0.04, 0.03], 0.01) == 3  # none: every epoch
    assert warm_stop.flags("org", 2)[-2:] == ["--eval-scenarios", "48"]
    assert warm_stop.flags("capitals", 1) == [
        "--steps", "0", "--sft-epochs", "1", "--sft-stop-loss", "0", "--eval-untrained", "false",
    ]  # fmt: skip
    assert warm_stop.flags("capitals", 2, "bfloat16")[-2:] == ["--compute-dtype", "bfloat16"]


def _row(task: str, epochs: int, sampled: float, tails: list[float], s: float) -> dict:
    sft = {"sft_epochs": float(len(tails)), "sft_seconds": s}
    sft.update({f"sft_epoch{k}_tail_loss": t for k, t in enumerate(tails, 1)})
    return {"task": task, "epochs": epochs, "sampled_before": sampled, "greedy_before": sampled,
            "sft": sft}  # fmt: skip


def test_the_table_gives_each_loss_its_stop_epoch_success_and_saving() -> None:
    rows = [_row("t", 1, 0.5, [0.08], 100.0), _row("t", 2, 0.9, [0.08, 0.01], 200.0)]
    rows.append(_row("t", 3, 0.92, [0.08, 0.01, 0.004], 300.0))
    text = warm_stop.table(rows)
    assert "| 0.1 | 2, 0.90 (0.92), 33% |" in text
    assert "| 0.01 | 2, 0.90 (0.92), 33% |" in text and "| 0.005 | 3, 0.92 (0.92), 0% |" in text


def test_the_table_gives_each_seed_and_the_mean() -> None:
    rows = [_row("t", 1, 0.5, [0.08], 100.0), _row("t", 2, 0.9, [0.08, 0.01], 200.0)]
    rows += [_row("t", 1, 0.7, [0.02], 110.0), _row("t", 2, 1.0, [0.02, 0.004], 210.0)]
    for r, seed in zip(rows, (1, 1, 2, 2), strict=True):
        r["seed"] = seed
    rows.append({**_row("t", 1, 0.3, [0.5], 60.0), "seed": 1, "dtype": "bfloat16"})
    text = warm_stop.table(rows)
    assert "| t | 2 | 0.95 (0.90, 1.00) | 0.95 (0.90, 1.00) | 0.080, 0.010; 0.020, 0.004 |" in text
    assert "| t (bf16) | 1 | 0.30 | 0.30 | 0.500 | - | 60 |" in text
    assert "| 0.01 | 2, 2, 0.95 (0.95), 0% |" in text  # both seeds stop at their second


@pytest.mark.slow
def test_a_warm_start_run_records_its_epochs(tmp_path: Path) -> None:
    os.chdir(ROOT)
    extra = warm_stop.flags("capitals", 2)
    extra += ["--base-model", "tiny", "--eval-scenarios", "2", "--eval-samples", "1"]
    extra += ["--max-tokens", "16", "--sft-stop-loss", "0"]
    slice_ = load_scenarios(validation_file("capitals", tmp_path))
    scen = tmp_path / "few.jsonl"  # 16 demonstrations, 4 held out: the record, not learning
    save_scenarios(scen, [s for s in slice_ if s.split == "train"][:16] + [
        s for s in slice_ if s.split == "val"][:4])  # fmt: skip
    row = run_one("capitals", 0, False, extra, tmp_path, name="w", scenarios=scen)
    sft = warm_stop.warm_record(tmp_path, "w")
    assert sft["sft_epochs"] == 2 and sft["sft_seconds"] > 0
    assert len(warm_stop.tails_of({"sft": sft})) == 2 and row["sampled_before"] >= 0
