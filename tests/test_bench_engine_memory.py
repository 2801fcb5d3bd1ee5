"""bench.engine_memory: its arms parse to budgets, a real evaluation runs under each (the
tiny model, two held-out scenarios of the org chart), and the table sets each against the
default arm."""

from __future__ import annotations

import json

import pytest

from art_langgraph.runtime.allocator import allocator_path
from bench.engine_memory import budgets, has_head, main, table


def test_arms_name_budgets_in_mib_and_a_malformed_arm_is_refused() -> None:
    assert budgets("default") == (None, None)
    assert budgets("kv512-prefix0") == (512 << 20, 0) == budgets("kv512-prefix0+decommit")
    assert budgets("default+decommit") == (None, None) == budgets("default+head+decommit")
    assert has_head("default+head") and has_head("ref:kv512-prefix0+head+decommit")
    assert not has_head("default+decommit")
    with pytest.raises(SystemExit, match="kv<MiB>-prefix<MiB>"):
        budgets("kv512")


def test_each_arm_evaluates_in_its_own_process_and_the_table_compares_them(tmp_path) -> None:
    main(["--base-model", "tiny", "--eval-scenarios", "2", "--arms", "default,kv8-prefix0+decommit",
          "--results", str(tmp_path)])  # fmt: skip
    (saved,) = tmp_path.glob("engine_memory_org_tiny_*.json")
    data = json.loads(saved.read_text())
    default, small = data["rows"]
    assert default["episodes"] == small["episodes"] == 6  # 2 scenarios x (1 greedy + 2 sampled)
    assert default["prefix_capacity_mib"] > 0 and small["prefix_capacity_mib"] == 0
    assert small["prefix_hit_share"] == 0 < default["prompt_tokens"]
    assert all(r["peak_rss_mib"] > 100 for r in data["rows"])
    if allocator_path():  # each child restarted itself on tcmalloc, as art-mcp does
        assert {r["allocator"] for r in data["rows"]} == {"tcmalloc"}
    assert "| kv8-prefix0+decommit |" in data["table"] and data["commit"]


def test_the_table_gives_ratios_against_the_default_arm() -> None:
    def row(arm: str, s: float) -> dict:
        return dict(arm=arm, eval_s=s, peak_rss_mib=2048.0, prefix_hit_share=0.5,
                    generated_tokens=1000, greedy_success=0.25, sampled_success=0.0)  # fmt: skip

    text = table([row("default", 100.0), row("kv256-prefix256", 150.0)])
    assert "| kv256-prefix256 | 150 s | 1.50x | 2.00 GiB | 50% | 7 | 0.25 / 0.00 |" in text
    # the log's whole seconds: a tiny preset's evaluation under 0.5 s reads 0, not a crash
    text = table([row("default", 0.0), row("kv256-prefix256", 1.0)])
    assert "| default | 0 s | - | 2.00 GiB | 50% | - |" in text
    assert "| kv256-prefix256 | 1 s | - | 2.00 GiB | 50% | 1000 |" in text


def test_ref_arms_run_from_another_checkout_in_alternating_rounds(tmp_path) -> None:
    """`ref:<arm>` runs the arm from `--ref`'s folder (here this checkout again: the same
    code, so the same episodes), every arm `--repeats` times, alternating."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with pytest.raises(SystemExit, match="another checkout"):
        main(["--arms", "ref:default", "--ref", str(tmp_path), "--results", str(tmp_path)])
    main(["--base-model", "tiny", "--eval-scenarios", "1", "--arms", "ref:default,default",
          "--ref", str(root), "--repeats", "2", "--results", str(tmp_path)])  # fmt: skip
    (saved,) = tmp_path.glob("engine_memory_org_tiny_*.json")
    data = json.loads(saved.read_text())
    assert [(r["arm"], r["round"]) for r in data["rows"]] == [
        ("ref:default", 1),
        ("default", 1),
        ("ref:default", 2),
        ("default", 2),
    ]
    assert len({r["greedy_success"] for r in data["rows"]}) == 1
    assert (
        "| ref:default (round 2) |" in data["table"] and f"against {root.name} at" in data["table"]
    )
