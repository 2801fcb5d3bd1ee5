"""The loggers contract: guarded calls, one warning per failing logger, the environment default."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import art_langgraph as art
from art_langgraph.integrations.langfuse import LangfuseLogger
from art_langgraph.trajectories.loggers import LoggerSet, RunInfo, loggers_from_env

RUN = RunInfo(name="m", project="p", base_model="tiny", folder=Path("."))


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []

    def log_trajectories(self, run: RunInfo, step: int, split: str, groups: list) -> None:
        self.calls.append(("trajectories", step, split))

    def log_metrics(self, run: RunInfo, step: int, split: str, metrics: dict) -> None:
        self.calls.append(("metrics", step, split))

    def close(self) -> None:
        self.calls.append(("close", -1, ""))


class Broken(Recorder):
    def log_trajectories(self, run: RunInfo, step: int, split: str, groups: list) -> None:
        raise ConnectionError("down")

    def log_metrics(self, run: RunInfo, step: int, split: str, metrics: dict) -> None:
        raise ConnectionError("still down")


def test_a_failing_logger_is_warned_about_once_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ok, broken = Recorder(), Broken()
    loggers = LoggerSet([broken, ok])
    group = art.TrajectoryGroup([art.Trajectory(reward=1.0)])
    with caplog.at_level(logging.WARNING, logger="art_langgraph.trajectories.loggers"):
        for step in (1, 2):
            loggers.trajectories(RUN, step, "train", [group])
            loggers.metrics(RUN, step, "train", {"loss": 0.5})
        loggers.close()
    assert ok.calls == [
        ("trajectories", 1, "train"),
        ("metrics", 1, "train"),
        ("trajectories", 2, "train"),
        ("metrics", 2, "train"),
        ("close", -1, ""),
    ]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "Broken failed in log_trajectories" in warnings[0]


def test_something_that_is_not_a_logger_is_refused() -> None:
    with pytest.raises(art.UsageError, match="not a logger"):
        LoggerSet([object()])  # type: ignore[list-item]


def test_langfuse_keys_in_the_environment_turn_export_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "ART_LANGFUSE"):
        monkeypatch.delenv(k, raising=False)
    assert loggers_from_env() == []
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk")
    monkeypatch.setenv("LANGFUSE_BASE_URL", "http://127.0.0.1:9")  # nothing listens
    (lg,) = loggers_from_env()
    assert isinstance(lg, LangfuseLogger) and lg.config.base_url == "http://127.0.0.1:9"
    lg.close()
    monkeypatch.setenv("ART_LANGFUSE", "0")
    assert loggers_from_env() == []
