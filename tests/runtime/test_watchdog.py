"""`WatchedProcess`, the supervisor of the vLLM server and the inference replicas: real
child processes (`python -c`) that become ready, fail to start, hang, and outlive a stop
request; and a parent killed outright, whose watched child must not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from art_langgraph.errors import InfrastructureError
from art_langgraph.runtime.watchdog import WATCHDOG, WatchedProcess


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            if state in "ZX":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def test_a_child_starts_until_ready_and_stops(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = WatchedProcess("toy", tmp_path / "toy.log")
    code = f"import pathlib, time; print('up', flush=True); pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"
    child.start(lambda fd: _python(code), os.environ, "toy", ready=ready.exists, timeout_s=60)
    assert child.alive() and child.pid is not None
    pid = child.pid
    assert "up" in child.tail()
    child.stop(grace_s=5)
    assert not child.alive() and _gone(pid)
    child.stop()  # idempotent


def test_a_child_that_exits_or_hangs_is_a_clear_error(tmp_path: Path) -> None:
    child = WatchedProcess("toy", tmp_path / "toy.log")
    with pytest.raises(
        InfrastructureError, match=r"toy exited with code 3 while starting(.|\n)*boom"
    ):
        child.start(
            lambda fd: _python("print('boom', flush=True); raise SystemExit(3)"),
            os.environ,
            "toy",
            ready=lambda: False,
            timeout_s=60,
        )
    with pytest.raises(InfrastructureError, match="toy did not start within 1 s"):
        child.start(
            lambda fd: _python("import time; time.sleep(600)"),
            os.environ,
            "toy",
            ready=lambda: False,
            timeout_s=1,
        )
    assert not child.alive()  # stopped on the way out


def test_a_scratch_folder_is_the_childs_tmpdir_and_goes_with_it(tmp_path: Path) -> None:
    """`scratch=True`: the child's TMPDIR is a folder of its own, deleted when it stops,
    when it fails to start, and (by the watchdog) when it exits on its own."""
    ready = tmp_path / "ready"
    child = WatchedProcess("vLLM 2", tmp_path / "s.log")
    code = (
        "import os, pathlib, tempfile, time; "
        "pathlib.Path(tempfile.gettempdir(), 'vllm_dist_x').mkdir(); "
        f"pathlib.Path({str(ready)!r}).write_text(tempfile.gettempdir()); time.sleep(600)"
    )
    child.start(lambda fd: _python(code), os.environ, "s", ready=ready.exists, timeout_s=60, scratch=True)  # fmt: skip
    folder = child.scratch
    assert folder is not None and folder.name.startswith("art-vllm-2-")
    assert ready.read_text() == str(folder) and (folder / "vllm_dist_x").is_dir()
    child.stop(grace_s=5)
    assert child.scratch is None and not folder.exists()

    with pytest.raises(InfrastructureError, match="exited with code 3 while starting"):
        child.start(lambda fd: _python("raise SystemExit(3)"), os.environ, "s", ready=lambda: False, timeout_s=60, scratch=True)  # fmt: skip
    assert child.scratch is None and not list(Path(os.path.dirname(folder)).glob("art-vllm-2-*"))

    ready.unlink()
    code = (
        f"import pathlib, tempfile; pathlib.Path({str(ready)!r}).write_text(tempfile.gettempdir())"
    )
    child.start(lambda fd: [sys.executable, "-c", WATCHDOG, str(fd), *_python(code)], os.environ, "s", ready=ready.exists, timeout_s=60, scratch=True)  # fmt: skip
    assert child.proc is not None and child.proc.wait(timeout=30) == 0
    assert not Path(ready.read_text()).exists()  # the watchdog deleted it as the child exited
    child.stop()


def test_a_child_ignoring_sigterm_is_killed_with_its_group(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = WatchedProcess("stubborn", tmp_path / "s.log")
    code = (
        "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"
    )
    child.start(lambda fd: _python(code), os.environ, "stubborn", ready=ready.exists, timeout_s=60)
    pid = child.pid
    assert pid is not None
    child.stop(grace_s=0.5)
    assert _gone(pid)


def test_the_child_dies_with_a_parent_killed_outright(tmp_path: Path) -> None:
    """A parent process starts a watched child under the watchdog, then is SIGKILLed: the
    watchdog reads EOF on its pipe, stops the child and deletes its scratch folder."""
    ready = tmp_path / "ready"
    server = (
        "import os, pathlib, time; "
        f"pathlib.Path({str(ready)!r}).write_text(str(os.getpid())); time.sleep(600)"
    )
    parent_code = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from art_langgraph.runtime.watchdog import WATCHDOG, WatchedProcess\n"
        f"c = WatchedProcess('server', Path({str(tmp_path / 'p.log')!r}))\n"
        f"c.start(lambda fd: [sys.executable, '-c', WATCHDOG, str(fd), sys.executable, '-c', {server!r}],\n"
        f"        os.environ, 'server', ready=Path({str(ready)!r}).exists, timeout_s=60, scratch=True)\n"
        "print(c.pid, c.scratch, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(_python(parent_code), stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid, scratch = parent.stdout.readline().split()
        watchdog_pid = int(pid)
        assert Path(scratch).is_dir()
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        server_pid = int(ready.read_text())
        assert _gone(watchdog_pid, within_s=30) and _gone(server_pid, within_s=30)
        assert not Path(scratch).exists()  # the watchdog deleted the server's TMPDIR
    finally:
        parent.kill()
