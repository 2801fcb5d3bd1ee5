"""Placement on a local Ray cluster (`ray.init` on this machine, num_cpus=2).

Replicas and trainer ranks as actors: one RL step end to end through the backend's real
server and the real `openai` client; a replica actor killed mid-rollout (the request is
retried, Ray restarts it, it gets the adapter back); a rank actor killed mid-step (the step
fails whole, the next one trains on new ranks). The two ways a start fails: an actor that
no node can take (the error names what it asked for and what the cluster has) and one that
dies starting (the error carries its traceback); and Ray missing (the error names the extra).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import art_langgraph as art
from art_langgraph.errors import InfrastructureError, MissingExtraError, TrainerRankError
from art_langgraph.scaleout.distributed import DistributedTrainer
from art_langgraph.scaleout.ray_cluster import ActorShare, ray_module
from art_langgraph.scaleout.ray_replica import RayReplica
from art_langgraph.scaleout.replicas import ReplicaEngine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray() -> Iterator[Any]:
    """A Ray instance in this process for this module's tests, stopped after them."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'art-langgraph\[ray\]'"):
        ray_module()


def test_an_actor_no_node_can_take_is_a_clear_error(ray: Any, tiny_path: Path) -> None:
    """What a node that never joins looks like from here: nobody has the resources."""
    share = ActorShare(num_cpus=1, num_gpus=1, threads=1)  # this cluster has no GPU
    with pytest.raises(InfrastructureError) as info:
        ReplicaEngine.start_ray(ray, str(tiny_path), 1, share=share, startup_timeout_s=3)
    text = str(info.value)
    assert "was not placed within 3 s" in text and "1 CPU, 1 GPU" in text
    assert "cluster: 2 CPU" in text and "nodes up: " in text


def test_an_actor_that_dies_starting_shows_its_error(ray: Any, tmp_path: Path) -> None:
    with pytest.raises(InfrastructureError) as info:
        ReplicaEngine.start_ray(ray, str(tmp_path / "no-model"), 1, startup_timeout_s=60)
    text = str(info.value)
    assert "replica 0 (a Ray actor) died while starting" in text
    assert "no-model" in text  # the end of its traceback says what it could not load


async def test_an_rl_step_with_replicas_and_ranks_as_actors(ray: Any, tmp_path: Path) -> None:
    from tests.backend.test_local_backend import _groups, _model

    async with art.LocalBackend(
        path=tmp_path, replicas=2, trainer_ranks=2, ray="auto", engine="torch"
    ) as backend:
        model = await _model(backend, "ray")  # starts the replicas
        engine = backend.engine
        assert isinstance(engine, ReplicaEngine)
        assert all(isinstance(m, RayReplica) for m in engine.replicas)

        # A replica actor killed mid-rollout: its requests are retried on the other one.
        victim: Any = engine.replicas[0]
        old_pid = victim.pid
        groups = asyncio.ensure_future(_groups(model, max_tokens=24))
        while not engine.router.in_flight[0]:  # replica 0 is answering a request
            await asyncio.sleep(0.005)
        os.kill(old_pid, signal.SIGKILL)
        groups_done = await groups
        assert engine.retries >= 1

        # One RL step end to end on two rank actors; the swap reaches both replicas.
        result = await model.train(groups_done, art.TrainConfig(learning_rate=2e-3))
        assert result.step == 1 and result.metrics["trainer_ranks"] == 2
        assert result.metrics["grad_norm"] > 0
        deadline = time.monotonic() + 120
        while not (engine.restarts[0] and 0 in engine.up()):  # Ray restarted it; we saw it back
            assert time.monotonic() < deadline, "the replica actor did not come back"
            await asyncio.sleep(0.1)
        assert victim.pid != old_pid
        for member in engine.replicas:
            health = httpx.get(member.url + "/health", timeout=10).json()  # type: ignore[attr-defined]
            assert "ray@1" in health["adapters"]
        # The replicas are on the node's address and guarded by a key only we hold.
        denied = httpx.post(victim.url + "/engine/metrics", timeout=10)
        assert denied.status_code == 401

        # A rank actor killed: the step fails whole; the next one trains on new actors.
        trainer = backend._runs["ray"].trainer
        assert isinstance(trainer, DistributedTrainer)
        groups_done = await _groups(model)
        os.kill(trainer.pids[1], signal.SIGKILL)
        with pytest.raises(TrainerRankError, match="trainer rank 1"):
            await model.train(groups_done, art.TrainConfig(learning_rate=2e-3))
        assert await model.get_step() == 1  # nothing of the failed step was applied
        again = await model.train(await _groups(model), art.TrainConfig(learning_rate=2e-3))
        assert again.step == 2 and again.metrics["trainer_ranks"] == 2
        assert backend._runs["ray"].trainer is not trainer  # new rank actors
