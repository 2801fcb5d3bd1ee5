"""`HarnessConfig.stop_when_flat`: RL ends after that many steps in a row trained on nothing,
with a line in the log and the report, and a restart that keeps the verdict; the step it
ends on is not evaluated again when no step since the last evaluation trained (its adapter
is the one evaluated). On the tiny preset and the bundled server."""

from __future__ import annotations

from pathlib import Path

import pytest

import art_langgraph as art
from art_mcp import HarnessConfig, Scenario, load_scenarios, train
from art_mcp.evaluation import Evaluation
from art_mcp.report import evaluated_weights, flat_run

ROOT = Path(__file__).resolve().parents[2]
SERVER = "python -m examples.mcp_server.server"
SCENARIOS = load_scenarios(ROOT / "examples/mcp_server/scenarios.jsonl")[:24]


def test_the_flat_run_counts_the_last_steps_in_a_row() -> None:
    steps = [{"nothing_trainable": x} for x in (1.0, 0.0, 1.0, 1.0)]
    assert flat_run(steps) == 2 and flat_run(steps[:2]) == 0 and flat_run([]) == 0


def test_an_evaluation_stands_until_a_step_trains() -> None:
    evs = [Evaluation(step=0, rl_step=0), Evaluation(step=3, rl_step=0)]
    flat, trained = {"nothing_trainable": 1.0}, {"nothing_trainable": 0.0}
    assert evaluated_weights(evs, []) is evs[1]
    assert evaluated_weights(evs, [{"step": 4, **flat}, {"step": 5, **flat}]) is evs[1]
    assert evaluated_weights(evs, [{"step": 4, **flat}, {"step": 5, **trained}]) is None
    # steps before the last evaluation do not count; no evaluation: nothing stands
    assert evaluated_weights(evs, [{"step": 2, **trained}, {"step": 4, **flat}]) is evs[1]
    assert evaluated_weights([], [{"step": 1, **flat}]) is None


def _flat(traj: art.Trajectory, s: Scenario) -> float:
    return 0.0


def _cfg(tmp_path: Path, **kw: object) -> HarnessConfig:
    base: dict[str, object] = dict(
        path=str(tmp_path), base_model="tiny", group_size=2, groups_per_step=2, steps=3,
        sft_epochs=0, max_tokens=16, max_turns=2, eval_scenarios=1, eval_samples=1,
        val_fraction=0.1, seed=5, eval_untrained=False,
    )  # fmt: skip
    return HarnessConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.slow
async def test_rl_ends_after_flat_steps_and_a_restart_keeps_it(tmp_path: Path) -> None:
    said: list[str] = []
    report = await train(SERVER, _cfg(tmp_path), scenarios=SCENARIOS, reward=_flat,
                         log=said.append)  # fmt: skip
    text = "\n".join(said)
    assert "RL ends after step 2 of 3: 2 steps in a row trained on nothing" in text, text
    assert "RL step 3" not in text
    assert report.ended_after == 2 and [e.rl_step for e in report.evaluations] == [0]
    assert "held-out not evaluated again: the adapter is step 0's" in text, text
    assert "RL ended after step 2 of 3" in (Path(report.folder) / "report.md").read_text()
    said.clear()
    again = await train(SERVER, _cfg(tmp_path), scenarios=SCENARIOS, reward=_flat,
                        log=said.append)  # fmt: skip
    assert "RL step" not in "\n".join(said) and again.ended_after == 2
    assert "RL ended after step 2 of 3: its last 2 steps trained on nothing" in "\n".join(said)
    said.clear()
    every = await train(SERVER, _cfg(tmp_path / "every", stop_when_flat=0), scenarios=SCENARIOS,
                        reward=_flat, log=said.append)  # fmt: skip
    assert every.ended_after is None and "RL step 3: train reward" in "\n".join(said)
