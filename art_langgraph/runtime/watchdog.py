"""A watchdog that makes a server subprocess die with the process that started it, and
`WatchedProcess`, the one supervisor of such children (vLLM, inference replicas): start
until ready, stop in steps, the log's end in every error (`log_tail`, which the MCP
harness's server errors quote too).

`WATCHDOG` is a standard-library-only script (it runs on the server's own Python, e.g.
vLLM's virtualenv) that starts the server as its child and leads its process group. It
holds the read end of a pipe whose write end only the starting process holds (`WATCH_FDS`
closes our ends in forked children). However that process dies (exit without cleanup,
SIGKILL), the kernel closes the write end, the watchdog reads EOF and stops the server
and its whole group, then deletes the server's scratch folder (its TMPDIR, where one was
asked for). The parent-death signal (PR_SET_PDEATHSIG) is not used: it fires
when the *thread* that spawned the child exits, and servers are started from worker
threads (`asyncio.to_thread`).

Left out: Windows (no process groups, no /proc), and the trainer's ranks, which need no
pipe: each rank's socket to this process is its lifeline (`scaleout/distributed.py`), and
a rank ends when it reads EOF there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

WATCHDOG = r"""
import os, shutil, signal, subprocess, sys, threading, time
fd, cmd = int(sys.argv[1]), sys.argv[2:]
scratch = os.environ.get("ART_WATCHDOG_SCRATCH")
server = subprocess.Popen(cmd)  # vLLM, in our process group, as are its engine core's
signal.signal(signal.SIGTERM, lambda *_: server.terminate())

def rest():  # the other live processes of our process group (vLLM's engine core, ...)
    me, out = os.getpid(), []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/stat") as f:
                state, _, group = f.read().rpartition(")")[2].split()[:3]
            if int(group) == me and int(p) != me and state not in "ZX":
                out.append(int(p))
        except (OSError, ValueError):
            pass
    return out

def sweep():  # give them 5 s to finish (the resource tracker frees shared memory), then kill
    deadline = time.monotonic() + 5
    while (left := rest()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

def orphaned():  # only the process that started us holds the write end
    while os.read(fd, 64):
        pass
    server.terminate()
    time.sleep(10)
    os.killpg(0, signal.SIGKILL)

threading.Thread(target=orphaned, daemon=True).start()
rc = server.wait()
if os.path.isdir("/proc"):
    sweep()
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
else:
    os.killpg(0, signal.SIGKILL)
sys.exit(rc if rc >= 0 else 128 - rc)
"""
"""Runs vLLM (argv[2:]) as its child, with the read end of our pipe as argv[1]. SIGTERM is
passed on to vLLM. When the pipe reads EOF (the process that started us died, however),
it stops vLLM (SIGTERM, then after 10 s SIGKILL to the whole group). When vLLM exits, it
gives the rest of the group 5 s to end, kills what is left, deletes the folder
$ART_WATCHDOG_SCRATCH names (the child's own temporary folder, `WatchedProcess.start`'s
`scratch`), and exits with vLLM's code.
Runs on vLLM's Python, so the standard library only."""

WATCH_FDS: set[int] = set()
"""Our write ends of the watchdogs' pipes: closed in a forked child, so that only this
process keeps the watchdogs waiting."""


def _close_watch_fds() -> None:
    for fd in WATCH_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    WATCH_FDS.clear()


os.register_at_fork(after_in_child=_close_watch_fds)


def spawn_watched(
    argv: Callable[[int], list[str]],
    log_path: Path,
    env: Mapping[str, str],
    header: str,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start `argv(read_fd)` in a session of its own, its output appended to `log_path`
    after a `header` line, holding the read end of a pipe whose write end only this
    process keeps (in `WATCH_FDS`): the child watches it (`WATCHDOG`, or its own loop) and
    ends when it reads EOF, however this process died. Returns the process and our write
    end (close it, or let this process exit, to stop the child)."""
    read_fd, write_fd = os.pipe()  # both close on exec; pass_fds hands the read end on
    try:
        with open(log_path, "ab") as out:
            out.write(f"\n--- {time.ctime()}: {header}\n".encode())
            proc = subprocess.Popen(
                argv(read_fd),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
                pass_fds=(read_fd,),
            )
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    WATCH_FDS.add(write_fd)
    return proc, write_fd


class WatchedProcess:
    """One supervised child: started with `spawn_watched` (it dies with this process),
    waited on until it is ready, stopped in steps. The vLLM server and each inference
    replica are one; their owners keep what is theirs (the command, the readiness probe,
    the URL, restarts).

    `what` names the child in errors ("vLLM", "replica 1"); `log_path` is where its output
    goes, whose end every error quotes."""

    def __init__(self, what: str, log_path: Path) -> None:
        self.what, self.log_path = what, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._watch_fd: int | None = None  # the write end of the child's pipe
        self.scratch: Path | None = None
        """The child's own temporary folder while it runs (`start`'s `scratch`), else None."""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(
        self,
        argv: Callable[[int], list[str]],
        env: Mapping[str, str],
        header: str,
        ready: Callable[[], bool],
        timeout_s: float,
        poll_s: float = 0.05,
        scratch: bool = False,
    ) -> None:
        """Start `argv(read_fd)` and wait until `ready()` is true. Raises
        InfrastructureError, quoting the end of the log, when the child exits first or is
        not ready within `timeout_s` (it is stopped then).

        `scratch`: give the child a temporary folder of its own (its TMPDIR, in the system's
        temporary folder) that is deleted once it has stopped: by `stop()`, and by
        `WATCHDOG` when the child exits, so also when this process was killed outright. vLLM
        leaves a `vllm_dist_*` folder and unix sockets in TMPDIR at every start."""
        from art_langgraph.errors import InfrastructureError

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if scratch:
            slug = re.sub(r"[^a-z0-9]+", "-", self.what.lower()).strip("-")
            self.scratch = Path(tempfile.mkdtemp(prefix=f"art-{slug}-"))
            env = {**env, "TMPDIR": str(self.scratch), "ART_WATCHDOG_SCRATCH": str(self.scratch)}
        try:
            self.proc, self._watch_fd = spawn_watched(argv, self.log_path, env, header)
        except BaseException:
            self._drop_scratch()
            raise
        deadline = time.monotonic() + timeout_s
        while not ready():
            if self.proc.poll() is not None:
                self._drop_scratch()
                raise InfrastructureError(
                    f"{self.what} exited with code {self.proc.returncode} while starting; the "
                    f"end of its log ({self.log_path}):\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise InfrastructureError(
                    f"{self.what} did not start within {timeout_s:.0f} s; the end of its log "
                    f"({self.log_path}):\n{self.tail()}"
                )
            time.sleep(poll_s)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then after `grace_s` SIGKILL to the child's whole process group (it
        leads one); our end of its pipe closed and its scratch folder deleted either way.
        Idempotent."""
        proc, self.proc = self.proc, None
        try:
            if proc is None or proc.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
        finally:
            fd, self._watch_fd = self._watch_fd, None
            if fd is not None:
                WATCH_FDS.discard(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._drop_scratch()

    def _drop_scratch(self) -> None:
        folder, self.scratch = self.scratch, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the child's log."""
        return "\n".join(log_tail(self.log_path, lines=lines)) or "(no log)"


def log_tail(path: Path | None, start: int = 0, lines: int = 40) -> list[str]:
    """The last `lines` lines of the log at `path` written after byte `start` (at most its
    last 16 KiB are read); none when there is no such file."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(max(start, f.seek(0, 2) - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
