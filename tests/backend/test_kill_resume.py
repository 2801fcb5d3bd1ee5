"""A process SIGKILLed in the middle of a training step loses nothing: the next start resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import art_langgraph as art
from tests.backend.rollouts import rollout

ROOT = Path(__file__).resolve().parents[2]


async def test_sigkill_mid_step_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.backend.kill_worker", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "in-step").exists():
            assert proc.poll() is None, (
                proc.stdout.read().decode() if proc.stdout else "worker died"
            )
            assert time.monotonic() < deadline, "the worker never reached step 2"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    model_dir = tmp_path / "kill" / "models" / "victim"
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == ["0001"]
    # the step's trajectories were saved before it trained
    assert (
        len(
            art.read_jsonl(
                model_dir / "trajectories" / "train" / "0002.jsonl", kind=art.TrajectoryGroup
            )
        )
        == 2
    )

    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(name="victim", project="kill", base_model="tiny")
        await model.register(backend)
        assert await model.get_step() == 1
        assert (await rollout(model, "after the crash")).calls[0].model == "victim@1"
        groups = art.read_jsonl(
            model_dir / "trajectories" / "train" / "0002.jsonl", kind=art.TrajectoryGroup
        )
        result = await model.train(groups, art.TrainConfig(learning_rate=2e-3))
        assert result.step == 2 and result.metrics["grad_norm"] > 0
        assert (await rollout(model, "resumed")).calls[0].model == "victim@2"
