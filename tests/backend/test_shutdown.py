"""A backend stops what it started however its script ends (art_langgraph/backend/shutdown.py).

The slow tests run each of the exit soak's scripts (bench/probes/exit_soak.py) once, as a
fresh process on the real model: a script that never closes its backend and returns,
raises, is stopped by SIGTERM or by SIGINT while calls are in flight, or logs to W&B
offline. Each must exit as
Python would without us, with no abort, its logger flushed, and no process left. Before
the fix the SIGINT script aborted in 2 of 3 runs, and the SIGTERM one lost its logger's
records in 3 of 3 (the issue 52 closing note has the soak's counts on the plain script).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import art_langgraph as art
from art_langgraph.backend.shutdown import OwnedResources
from art_langgraph.errors import UsageError
from art_langgraph.trajectories.loggers import LoggerSet
from bench.probes.exit_soak import run_variant


class _Part:
    def __init__(self, name: str, done: list[str], fail: bool = False) -> None:
        self.name, self.done, self.fail = name, done, fail

    def stop(self) -> None:
        self.done.append(self.name)
        if self.fail:
            raise RuntimeError(f"{self.name} failed to stop")

    close_sync = close = shutdown = stop

    def log_trajectories(self, *a: Any) -> None: ...
    def log_metrics(self, *a: Any) -> None: ...


def test_parts_stop_in_order_and_a_failure_stops_none_of_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []
    owned = OwnedResources(LoggerSet([_Part("loggers", done)]))  # type: ignore[list-item]
    owned.server = _Part("server", done)  # type: ignore[assignment]
    owned.engine = _Part("engine", done, fail=True)  # type: ignore[assignment]
    owned.trainers = {"a": _Part("trainer", done)}  # type: ignore[dict-item]
    owned.ray = _Part("ray", done)
    owned.close()
    assert done == ["server", "engine", "trainer", "loggers", "ray"]
    assert "stopping the engine failed" in caplog.text
    owned.close()  # nothing left to stop
    assert done == ["server", "engine", "trainer", "loggers", "ray"]


_COLLECTED = """
import asyncio, gc, sys, time
import art_langgraph as art

async def main():
    backend = art.LocalBackend(path=sys.argv[1])
    model = art.TrainableModel(name="m", project="p", base_model="tiny")
    await model.register(backend)
    threads = [backend.engine._thread, backend.server._thread]
    assert all(t.is_alive() for t in threads)
    del backend, model
    # The executor thread that ran the backend's start drops its bound method only after
    # the await resumes: on a busy host it may still hold the backend at the first collect.
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    print([t.is_alive() for t in threads])

asyncio.run(main())
"""


def test_a_collected_backend_stops_its_engine_and_server(tmp_path: Path) -> None:
    """In a process of its own: in the suite's, other tests' objects may keep it alive."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _COLLECTED, str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[False, False]"


async def test_a_closed_backend_refuses_new_models_and_closes_once(tmp_path: Path) -> None:
    backend = art.LocalBackend(path=tmp_path)
    model = art.TrainableModel(name="m", project="p", base_model="tiny")
    await model.register(backend)
    await backend.close()
    backend.close_sync()
    assert backend.engine is None and backend.server is None
    with pytest.raises(UsageError, match="closed"):
        await model.register(backend)
    with pytest.raises(UsageError, match="closed"):  # not a trainer it closed, nor an engine gone
        await model.train([])


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["plain", "raises", "sigterm", "sigint", "wandb"])
def test_a_script_that_never_closes_its_backend_exits_as_python_would(
    variant: str, tmp_path: Path
) -> None:
    """One run of each script: the soak (`python -m bench.probes.exit_soak`) repeats them
    to count how often an end goes wrong; CI checks that each ends right."""
    outcome = run_variant(variant, tmp_path)
    assert outcome.ok, outcome.why


def test_a_hung_script_is_reported_with_its_threads_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's hang guard: a script still running past HANG_S fails its run with where
    each of its threads stood (py-spy), and its process group is killed."""
    from bench.probes import exit_soak

    monkeypatch.setattr(
        exit_soak, "_SCRIPT", "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"
    )
    monkeypatch.setattr(exit_soak, "HANG_S", 5)
    outcome = exit_soak.run_variant("plain", tmp_path)
    assert not outcome.ok and outcome.why.startswith("still running 5 s after its end")
    assert "<module> (script.py:3)" in outcome.why, outcome.why  # the frame, from py-spy
    assert outcome.seconds < 120


@pytest.mark.slow
def test_ctrl_c_reaches_a_script_whose_parent_ignores_it(tmp_path: Path) -> None:
    """A shell's background job (`./scripts/test.sh &`) runs with SIGINT ignored, and its
    children inherit that; the soak gives its script Ctrl-C's default as a terminal does, so
    the `sigint` script still stops (before, it ran on until the hang guard)."""
    import signal

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        outcome = run_variant("sigint", tmp_path)
    finally:
        signal.signal(signal.SIGINT, before)
    assert outcome.ok, outcome.why
