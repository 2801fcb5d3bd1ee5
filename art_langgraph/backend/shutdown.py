"""Stopping what a `LocalBackend` started, whether or not its user closed it.

A backend owns threads and processes: the torch engine's worker thread, the OpenAI
server's thread, a distributed trainer's ranks, a Ray instance, and loggers with records
still to flush. Its threads are daemon threads, so a script that never closes the backend
(ART's examples do not) still ends. But a daemon thread that is still running when the
interpreter finalizes is torn down by `pthread_exit` the next time it asks for the GIL,
and the forced unwind that `pthread_exit` starts runs through torch's C++ frames (a
tensor freed with the GIL released: `THPVariable_clear`), which may not unwind:
`terminate called without an active exception`, SIGABRT, exit status 134, in 13 of 20
runs of a script that served a few requests and returned (issue 52, found with gdb).

So `stop_at_exit` registers, per backend, a `weakref.finalize` that stops its
`OwnedResources` in order (server, engine, trainers' processes, loggers, Ray) and joins
their threads. It runs when the backend is collected, when `close()` calls it, or at
interpreter exit through `atexit`, which Python runs before it finalizes, whether the
script returned, called `sys.exit`, raised, or was stopped by Ctrl-C. SIGTERM's default
action ends the process with no exit handlers at all, so records would be lost: while a
backend is open and SIGTERM still has its default action, a handler closes the open
backends, then restores the default and re-raises the signal, so the process still ends
"killed by SIGTERM", as it would without us. A handler the user installed is left alone.

Left out: SIGKILL (nothing can run; checkpoints are written atomically and the managed
vLLM server and trainer ranks watch their parent) and signals other than SIGTERM and SIGINT.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from art_langgraph.trajectories.loggers import LoggerSet

if TYPE_CHECKING:
    from art_langgraph.engine.base import InferenceEngine
    from art_langgraph.serving.runner import ServerHandle
    from art_langgraph.training.base import Trainer

log = logging.getLogger(__name__)


@dataclass
class OwnedResources:
    """What one backend started and must stop. Kept apart from the backend, so that the
    finalizer holding it does not keep the backend alive."""

    loggers: LoggerSet
    """Flushed and closed last but one, once nothing can produce more records."""
    engine: InferenceEngine | None = None
    """Its worker thread (or server process) is stopped and joined."""
    server: ServerHandle | None = None
    """Stopped first, so no request arrives at a stopping engine."""
    trainers: dict[str, Trainer] = field(default_factory=dict)
    """Per model name; a distributed trainer's rank processes are stopped."""
    ray: Any = None
    """The `ray` module, when the backend started a Ray instance of its own ("local")."""
    closed: bool = False

    def close(self) -> None:
        """Stop everything, in order, once; a part that fails is logged and the rest still stop."""
        if self.closed:
            return
        self.closed = True
        server, self.server = self.server, None
        engine, self.engine = self.engine, None
        trainers, self.trainers = list(self.trainers.values()), {}
        ray, self.ray = self.ray, None
        steps: list[tuple[str, Any]] = []
        if server is not None:
            steps.append(("the server", server.stop))
        if engine is not None:
            steps.append(("the engine", engine.close_sync))
        steps += [("a trainer", t.close) for t in trainers]
        steps.append(("the loggers", self.loggers.close))
        if ray is not None:
            steps.append(("Ray", ray.shutdown))
        for what, stop in steps:
            try:
                stop()
            except Exception:
                log.exception("closing the backend: stopping %s failed", what)


_open: list[weakref.finalize] = []
"""The finalizers of backends not yet closed (pruned as they run), newest last."""
_lock = threading.Lock()


def stop_at_exit(backend: object, owned: OwnedResources) -> weakref.finalize:
    """A finalizer that closes `owned` once: when called, when `backend` is collected, or
    at interpreter exit. Also installs the SIGTERM handler (see the module docstring)."""
    finalizer = weakref.finalize(backend, owned.close)
    with _lock:
        _open[:] = [f for f in _open if f.alive]
        _open.append(finalizer)
    _handle_sigterm()
    return finalizer


def close_open_backends() -> None:
    """Close every backend still open, newest first (what SIGTERM does; at a normal exit
    `weakref.finalize`'s own atexit hook calls the same finalizers)."""
    with _lock:
        pending = [f for f in reversed(_open) if f.alive]
        _open.clear()
    for finalizer in pending:
        finalizer()


def _handle_sigterm() -> None:
    """Install `_on_sigterm` where SIGTERM has its default action (only the main thread can)."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm or current != signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: object) -> None:
    log.warning("SIGTERM: closing the open backends before the process ends")
    try:
        close_open_backends()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
