"""Subprocess for the kill test: trains one step, then stalls inside the next until killed.

    python -m tests.backend.kill_worker ART_PATH

Writes ART_PATH/in-step when it is inside step 2 (a micro-batch has run), then sleeps.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import art_langgraph as art
from tests.backend.rollouts import rollout


async def main(path: Path) -> None:
    async with art.LocalBackend(path=path) as backend:
        model = art.TrainableModel(name="victim", project="kill", base_model="tiny")
        await model.register(backend)
        for step in range(2):
            trajs = await asyncio.gather(*(rollout(model, f"number {i}") for i in range(8)))
            for i, t in enumerate(trajs):
                t.reward = float(i % 2)
            groups = [art.TrajectoryGroup(trajs[:4]), art.TrajectoryGroup(trajs[4:])]

            def stall(stage: str, info: dict, step: int = step) -> None:
                if step == 1 and stage == "micro_batch":
                    (path / "in-step").write_text("1")
                    time.sleep(600)

            await model.train(groups, art.TrainConfig(learning_rate=2e-3), progress=stall)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
