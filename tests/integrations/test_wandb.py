"""W&B logging in offline mode: a real training step and a logged split, read back from the run files.

The run's `.wandb` file is W&B's record log (LevelDB log framing around `Record`
protobufs from `wandb.proto`); `_records` reads it back, so the test sees what W&B would
sync: the run id and name, the history rows, and the table files.
"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from wandb.proto import wandb_internal_pb2

import art_langgraph as art
from art_langgraph.integrations.wandb import WandbLogger
from art_langgraph.trajectories.logger_protocol import RunInfo
from tests.backend.rollouts import rollout


def _records(path: Path) -> list[Any]:
    raw, block, pos = path.read_bytes(), 32768, 7  # 7: the ':W&B' file header
    records, pending = [], b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:  # full
            records.append(data)
        elif kind == 2:  # first
            pending = data
        elif kind == 3:  # middle
            pending += data
        elif kind == 4:  # last
            records.append(pending + data)
    out = []
    for data in records:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        out.append(rec)
    return out


def _history(run_dir: Path) -> tuple[Any, list[dict[str, Any]]]:
    (wandb_file,) = run_dir.glob("run-*.wandb")
    recs = _records(wandb_file)
    run = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    rows = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in recs
        if r.WhichOneof("record_type") == "history"
    ]
    return run, rows


async def test_steps_rewards_and_trajectories_reach_an_offline_run(
    lg_backend: art.LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    model = art.TrainableModel(name="wb", project="lg", base_model="tiny")
    await model.register(lg_backend)
    logger = WandbLogger(dir=tmp_path)
    lg_backend.loggers.loggers.append(logger)
    try:
        trajs = list(await asyncio.gather(*(rollout(model, f"Say {i}") for i in range(6))))
        for i, t in enumerate(trajs):
            t.reward = float(i % 3)
        result = await model.train(
            [art.TrajectoryGroup(trajs[:3]), art.TrajectoryGroup(trajs[3:])], art.TrainConfig()
        )
        await model.log([art.TrajectoryGroup(trajs[:2])], split="val")
    finally:
        lg_backend.loggers.loggers.remove(logger)
        logger.close()

    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    run, rows = _history(run_dir)
    assert run.run_id == WandbLogger.run_id(RunInfo(name="wb", project="lg", base_model="tiny"))
    assert run.display_name == "wb" and run.project == "lg"
    train = [
        r for r in rows if "train/reward_std" in r
    ]  # the batch row (metrics have a reward too)
    assert len(train) == 1 and train[0]["training_step"] == result.step
    assert train[0]["train/reward"] == pytest.approx(1.0) and train[0]["train/trajectories"] == 6
    metrics = [r for r in rows if "train/loss" in r]
    assert metrics and metrics[0]["training_step"] == result.step
    assert metrics[0]["train/grad_norm"] == pytest.approx(result.metrics["grad_norm"])
    val = [r for r in rows if "val/rollouts/reward_mean" in r]
    assert val[0]["val/rollouts/reward_mean"] == pytest.approx(0.5)
    assert val[0]["training_step"] == result.step
    assert [r["val/reward"] for r in rows if "val/reward" in r] == [pytest.approx(0.5)]
    tables = sorted((run_dir / "files" / "media" / "table").glob("trajectories_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[0].read_text())
    assert table["columns"][:5] == ["step", "split", "group", "trajectory_id", "reward"]
    assert len(table["data"]) == 6 and {row[3] for row in table["data"]} == {t.id for t in trajs}

    # the same model again (a resumed training) continues the same run id
    again = WandbLogger(dir=tmp_path)
    info = RunInfo(name="wb", project="lg", base_model="tiny")
    again.log_metrics(info, result.step + 1, "train", {"loss": 0.5})
    again.close()
    ids = {_history(d)[0].run_id for d in (tmp_path / "wandb").glob("offline-run-*")}
    assert ids == {run.run_id}


def test_close_leaves_a_run_of_the_users_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() tears W&B's service down only when no other run is active: a run the user
    opened themselves keeps logging after our logger closed."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    users = wandb.init(project="mine", dir=str(tmp_path), reinit="create_new")
    logger = WandbLogger(dir=tmp_path / "ours")
    info = RunInfo(name="wb2", project="lg", base_model="tiny")
    logger.log_metrics(info, 1, "train", {"loss": 0.25})
    logger.close()
    users.log({"still": 1.0})  # would raise on a finished run
    users.finish()
    wandb.teardown()  # the user's own wait: our records reach disk with theirs
    (ours,) = (tmp_path / "ours" / "wandb").glob("offline-run-*")
    assert [r["train/loss"] for r in _history(ours)[1] if "train/loss" in r] == [0.25]
    (theirs,) = (tmp_path / "wandb").glob("offline-run-*")
    assert [r["still"] for r in _history(theirs)[1] if "still" in r] == [1.0]
