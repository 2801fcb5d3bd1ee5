"""Learning, shown: the tiny preset raises its held-out reward by >= 0.4 within 30 GRPO steps.

The toy task: reply to "Say a number word" with a reply that contains one (one..ten).
Rollouts go through the real server; rewards are computed from the text; each step
trains on 4 groups of 8. Held-out prompts are never trained on.

In float32 on every host (tests/conftest.py FP32), `auto`'s choice for a model this small
(`devices.FLOAT32_MAX_PARAMS`), pinned: this is a test of the learning machinery, and the
random 2-layer model does not learn in bfloat16. On a host with AMX (2026-11-27, 2 cores)
its held-out reward went from 0.06 to at best 0.19 in 30 steps in bfloat16; the real
model's learning in bfloat16 is tests/test_demo.py's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import art_langgraph as art
from tests.backend.rollouts import rollout
from tests.conftest import FP32

pytestmark = pytest.mark.slow


async def test_heldout_reward_rises_by_0_4_within_30_steps(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path, engine=art.EngineChoice(config=FP32)) as backend:
        model = art.TrainableModel(name="learner", project="toy", base_model="tiny")
        await model.register(backend)
        val = [f"Say a number word. Held-out item {i}." for i in range(32)]

        async def evaluate() -> float:
            ts = await asyncio.gather(*(rollout(model, p, seed=i) for i, p in enumerate(val)))
            return sum(t.reward for t in ts) / len(ts)

        before = await evaluate()
        best = before
        config = art.TrainConfig(learning_rate=2e-3)
        for step in range(30):
            prompts = [f"Say a number word. Training item {step}-{j}." for j in range(4)]
            trajs = await asyncio.gather(*(rollout(model, p) for p in prompts for _ in range(8)))
            groups = [art.TrajectoryGroup(trajs[j * 8 : (j + 1) * 8]) for j in range(4)]
            result = await model.train(groups, config)
            assert result.step == step + 1
            if step % 3 == 2:
                best = max(best, await evaluate())
                if best - before >= 0.4:
                    break
        assert best - before >= 0.4, f"held-out reward went from {before:.2f} to at best {best:.2f}"
