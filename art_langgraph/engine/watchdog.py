"""A watchdog that makes a server subprocess die with the process that started it.

`WATCHDOG` is a standard-library-only script (it runs on the server's own Python, e.g.
vLLM's virtualenv) that starts the server as its child and leads its process group. It
holds the read end of a pipe whose write end only the starting process holds (`WATCH_FDS`
closes our ends in forked children). However that process dies (exit without cleanup,
SIGKILL), the kernel closes the write end, the watchdog reads EOF and stops the server
and its whole group. The parent-death signal (PR_SET_PDEATHSIG) is not used: it fires
when the *thread* that spawned the child exits, and servers are started from worker
threads (`asyncio.to_thread`).

Left out: Windows (no process groups, no /proc).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["WATCHDOG", "WATCH_FDS", "spawn_watched"]

WATCHDOG = r"""
import os, signal, subprocess, sys, threading, time
fd, cmd = int(sys.argv[1]), sys.argv[2:]
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
else:
    os.killpg(0, signal.SIGKILL)
sys.exit(rc if rc >= 0 else 128 - rc)
"""
"""Runs vLLM (argv[2:]) as its child, with the read end of our pipe as argv[1]. SIGTERM is
passed on to vLLM. When the pipe reads EOF (the process that started us died, however),
it stops vLLM (SIGTERM, then after 10 s SIGKILL to the whole group). When vLLM exits, it
gives the rest of the group 5 s to end, kills what is left, and exits with vLLM's code.
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
