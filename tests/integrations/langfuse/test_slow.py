"""A slow Langfuse never stops training: every send gives up at the client timeout.

The local receiver (`receiver.py`) waits `delay_s` before answering each request, longer
than `LangfuseConfig.timeout_s`. What a training step sends to Langfuse then times out:
a step's trajectories (the backend's `LangfuseLogger`, through the guarded `LoggerSet`
a backend calls), the held-out evaluation's dataset run, the review picks and the judge
calibration's run scores. None of them raises; each is recorded as not sent, and
`export_folder` (`art-langgraph langfuse export MODEL_DIR`) sends all of it once the
receiver is fast again, and only once. No timing is asserted: only what was sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import art_langgraph as art
from art_langgraph.integrations.langfuse import LangfuseConfig, LangfuseLogger, export_folder
from art_langgraph.integrations.langfuse.annotation import REVIEW_FILE, send_to_review
from art_langgraph.integrations.langfuse.datasets import EVALUATIONS_FILE, log_evaluation
from art_langgraph.integrations.langfuse.folder import EXPORTS_FILE, exported
from art_langgraph.integrations.langfuse.review import SCORES_FILE, ReviewedScore, calibrate
from art_langgraph.integrations.langfuse.scoring import REVIEW_SCORE
from art_langgraph.integrations.langfuse.traces import trace_id_for
from art_langgraph.serving.runner import ServerHandle, start_app_server
from art_langgraph.trajectories.loggers import LoggerSet, RunInfo
from tests.integrations.langfuse.receiver import Receiver, base_url

TIMEOUT_S = 0.2
"""The client's timeout while Langfuse is slow; each request takes DELAY_S."""
DELAY_S = 1.0


@pytest.fixture
def slow_receiver() -> Iterator[tuple[Receiver, ServerHandle]]:
    rec = Receiver(delay_s=DELAY_S)
    handle = start_app_server(rec.app())
    yield rec, handle
    rec.delay_s = 0.0
    handle.stop()


def _config(handle: ServerHandle, timeout_s: float) -> LangfuseConfig:
    return LangfuseConfig(
        public_key="pk-test",
        secret_key="sk-test",
        base_url=base_url(handle),
        timeout_s=timeout_s,
        flush_timeout_s=30,
    )


def _groups() -> list[art.TrajectoryGroup]:
    def traj(name: str, reward: float) -> art.Trajectory:
        t = art.Trajectory(
            id=name,
            messages=[
                {"role": "user", "content": f"What is {name}?"},
                {"role": "assistant", "content": "4"},
            ],
            reward=reward,
        )
        t.metrics["ruler_score"] = reward
        t.metrics["independent_reward"] = 1.0 - reward
        return t

    return [art.TrajectoryGroup([traj(f"t{i}", r) for i, r in enumerate((0.0, 0.5, 1.0))])]


def test_a_slow_langfuse_never_stops_a_step_and_export_sends_it_later(
    slow_receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    rec, handle = slow_receiver
    slow = _config(handle, TIMEOUT_S)
    folder = tmp_path / "proj" / "models" / "agent"
    groups = _groups()

    # the step: as LocalBackend.log does it, loggers first (guarded), then the saved JSONL
    logger = LangfuseLogger(slow)
    loggers = LoggerSet([logger])
    loggers.trajectories(RunInfo("agent", "proj", "tiny", folder), 0, "train", groups)
    (folder / "trajectories/train").mkdir(parents=True)
    art.write_jsonl(folder / "trajectories/train/0000.jsonl", groups)
    loggers.close()
    assert logger.report.failed_batches == [("train", 0)] and logger.report.batches == 0
    assert not exported(folder) and not (folder / EXPORTS_FILE).exists()

    # the held-out evaluation, the review picks, the judge's run scores: none raises
    scenario = {"id": "s1", "task": "What is 2 plus 2?", "answer": "4"}
    evaluation = log_evaluation(
        "slow-held-out",
        "agent@0",
        [(scenario, t) for t in groups[0]],
        folder=folder,
        config=slow,
    )
    assert not evaluation.sent and "Timeout" in str(evaluation.error)
    picks = send_to_review(
        groups, queue="slow", fraction=1.0, folder=folder, split="train", step=0, config=slow
    )
    assert picks.unsent == len(picks.picks) == 3 and "Timeout" in str(picks.error)
    reviews = [
        ReviewedScore(id=f"r{i}", trace_id=trace_id_for(t), name=REVIEW_SCORE, value=v, source="A")
        for i, (t, v) in enumerate(zip(groups[0], (0.0, 0.5, 1.0), strict=True))
    ]
    calibrate(folder, queue="slow", dataset_run_id="run-x", config=slow, scores=reviews)
    for name in (EVALUATIONS_FILE, REVIEW_FILE, SCORES_FILE):
        statuses = {json.loads(x)["status"] for x in (folder / name).read_text().splitlines()}
        assert statuses == {"unsent"}, name

    # Langfuse is fast again: export sends what was recorded, once
    rec.delay_s = 0.0
    fast = _config(handle, 10.0)
    report = export_folder(folder, config=fast)
    assert (report.batches, report.trajectories, report.scores) == (1, 3, 9)
    assert not report.failed_batches and not report.failed_evaluations
    assert report.evaluations == 1 and report.review_items == 3 and report.run_scores == 2
    assert exported(folder) == {("train", 0)}
    ids = {trace_id_for(t) for t in groups[0]}
    assert ids <= set(rec.traces)
    assert {i["objectId"] for i in rec.queue_items.values()} == ids
    assert {s["name"] for s in rec.scores.values() if s.get("datasetRunId") == "run-x"} == {
        "judge_spearman",
        "judge_top_pick_accuracy",
    }
    names = {c["id"]: c["name"] for c in rec.score_configs.values()}
    assert all(names[s["configId"]] == s["name"] for s in rec.scores.values())

    again = export_folder(folder, config=fast)
    assert (again.batches, again.evaluations, again.review_items, again.run_scores) == (0, 0, 0, 0)
