"""Dynamic sampling (`HarnessConfig.refill_groups`): a step rolls out other training
scenarios in place of its flat groups (one reward for every rollout), up to its budget, in
an order fixed by the seed; off by default. On the tiny preset and the bundled server."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

import art_langgraph as art
from art_mcp import HarnessConfig, Scenario, load_scenarios, train
from art_mcp.rollouts import flat_groups, refills

ROOT = Path(__file__).resolve().parents[2]
SERVER = "python -m examples.mcp_server.server"
SCENARIOS = load_scenarios(ROOT / "examples/mcp_server/scenarios.jsonl")[:24]


def _group(*rewards: float) -> art.TrajectoryGroup:
    return art.TrajectoryGroup([art.Trajectory(reward=r) for r in rewards])


def test_refills_are_the_other_training_scenarios_in_a_seeded_order() -> None:
    step = SCENARIOS[:4]
    order = [s.id for s in refills(SCENARIOS, step, seed=3, step=0)]
    assert sorted(order) == sorted(s.id for s in SCENARIOS[4:])  # all the others, once
    assert order == [s.id for s in refills(SCENARIOS, step, seed=3, step=0)]  # every process
    assert order != [s.id for s in refills(SCENARIOS, step, seed=3, step=1)]  # another step's


def test_a_flat_group_is_one_reward_for_every_rollout() -> None:
    assert flat_groups([_group(1.0, 1.0), _group(0.0, 1.0), _group(0.5, 0.5, 0.5)]) == 2


def _cfg(tmp_path: Path, **kw: object) -> HarnessConfig:
    base: dict[str, object] = dict(
        path=str(tmp_path), base_model="tiny", group_size=2, groups_per_step=4, steps=1,
        sft_epochs=0, max_tokens=16, max_turns=2, eval_scenarios=1, eval_samples=1,
        val_fraction=0.1, seed=5,
    )  # fmt: skip
    return HarnessConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.slow
async def test_flat_groups_are_replaced_up_to_the_budget_and_groups_with_signal_are_kept(
    tmp_path: Path,
) -> None:
    def flat(traj: art.Trajectory, s: Scenario) -> float:
        return 0.0

    said: list[str] = []
    await train(SERVER, _cfg(tmp_path / "a", refill_groups=3), scenarios=SCENARIOS,
                reward=flat, log=said.append)  # fmt: skip
    text = "\n".join(said)
    # 4 flat groups, 3 drawn in their place (all flat too): the budget ends the refills
    assert "RL step 1: 14 of 14 rollouts (3 groups drawn in place of flat ones)" in text, text
    assert "TRAINED ON NOTHING" in text

    seen: collections.Counter[str] = collections.Counter()

    def alternating(traj: art.Trajectory, s: Scenario) -> float:
        seen[s.id] += 1
        return float(seen[s.id] % 2)  # each group of two: one 0, one 1

    said.clear()
    await train(SERVER, _cfg(tmp_path / "b", refill_groups=3), scenarios=SCENARIOS,
                reward=alternating, log=said.append)  # fmt: skip
    text = "\n".join(said)
    assert "RL step 1: 8 of 8 rollouts in" in text and "drawn in place" not in text, text
