"""Capture: every LLM call and tool call of a LangChain/LangGraph run, recorded as a Trajectory.

`capture()` is a sync and async context manager. Inside it a `TrajectoryCallback`
(`callback.py`) is attached to every LangChain run (through LangChain's configure hook,
keyed by a contextvar, so concurrent rollouts in `asyncio.gather` never mix): each
chat-model call becomes an `LLMCall` (for a `TrainableChatModel`, as the server sent it,
with the exact prompt/completion token ids, logprobs and the serving step), each tool
call a `ToolEvent`, and the final conversation of the outermost graph fills `messages`.
An exception that leaves the block is recorded on the trajectory, then re-raised.
`current_handler()` lets the capturing transport (`openai_capture.py`) record a plain
OpenAI client's calls into the open block too: one capture path for both clients.

A run stopped at a LangGraph `interrupt()` is kept with its thread (`thread=`, `store=`)
and continued by the capture that resumes it (`interrupts.py`); `train_nodes` picks the
calls that train. `seed` seeds the block's requests: the k-th request the trainable chat
model sends inside it carries the sampling seed `derive_seed(seed, k)` (a request that
sets its own `seed` keeps it), so a run replays its sampling draws (`art.rollouts(...,
seed=)` gives each run of a group its own).

Left out: the handler itself (`callback.py`) and the wire (`openai_capture.py`).
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import os
import warnings
from collections.abc import Mapping
from functools import partial
from typing import Any

from langchain_core.tracers.context import register_configure_hook

from art_langgraph.errors import UsageError
from art_langgraph.gathering.interrupts import ThreadStore, thread_id_of
from art_langgraph.tracing.callback import TrainNodes, TrajectoryCallback
from art_langgraph.trajectories.trajectory import Trajectory

_CURRENT: contextvars.ContextVar[TrajectoryCallback | None] = contextvars.ContextVar(
    "art_capture", default=None
)
register_configure_hook(_CURRENT, inheritable=True)


def current_handler() -> TrajectoryCallback | None:
    """The handler recording in this context, if a `capture()` is open."""
    return _CURRENT.get()


def derive_seed(seed: int, *path: int) -> int:
    """A seed in [0, 2**63) for `path` under `seed`: unrelated for different paths (a
    hash, not `seed + k`, so runs seeded `s` and `s + 1` share no request's draws)."""
    digest = hashlib.blake2b(repr((seed, *path)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def request_seed() -> int | None:
    """The sampling seed of the next request in this context: the open capture's next one
    when it was given `seed=`, else None."""
    handler = _CURRENT.get()
    seeds = handler.request_seeds if handler is not None else None
    return next(seeds) if seeds is not None else None


def current_trajectory() -> Trajectory | None:
    """The trajectory being captured in this context, if any."""
    handler = _CURRENT.get()
    return handler.trajectory if handler is not None else None


class capture:
    """Record everything LangChain runs inside the block into a new Trajectory (see module doc).

    Args:
        metadata: merged into the trajectory's metadata.
        trajectory: record into this trajectory instead of a new one.
        train_nodes: which calls of the trainable model train: node names (a call trains
            when its `node`, or any node of its `namespace`, is named: naming a subgraph's
            node trains every call inside it), or a predicate over the `LLMCall`. The other
            calls stay recorded, for review and judging, with `trainable=False` and
            `metadata["art_excluded"] = "train_nodes"`. None (the default): every call of
            the trainable model trains.
        thread: a LangGraph config (or its thread id) whose run may stop at `interrupt()`
            and be resumed later, in this process or another; needs `store`. A run that
            stops at an interrupt is saved in `store`, and the capture that resumes the
            thread continues the same trajectory (`interrupts.py`).
        store: the folder for `thread`'s waiting trajectory.
        part_of_thread: the block runs only part of a thread on purpose (`art.branch`
            does: a branch trains what follows its checkpoint), so resuming an interrupt
            without `thread=` is not warned about.
        seed: seeds the block's sampling: the trainable chat model's k-th request in it
            carries `seed=derive_seed(seed, k)` unless it sets its own (each is recorded
            in its `LLMCall.sampling`); k counts on from the calls of a thread it resumes.
            Requests the graph makes concurrently (a fan-out, `Send`) take their k in the
            order they are sent, which may differ from run to run. None: a block inside a
            seeded one goes on with its seeds; otherwise requests carry no seed, and draw
            from the server's shared generator.

    Raises (on leaving the block):
        UsageError: the block resumed a thread (`Command(resume=...)`) for which `store` held
            no trajectory: its calls before the interrupt are lost, and it would train as a
            fresh run. The graph's own state is kept by its checkpointer.
    """

    def __init__(
        self,
        metadata: dict[str, Any] | None = None,
        trajectory: Trajectory | None = None,
        *,
        train_nodes: TrainNodes | None = None,
        thread: str | Mapping[str, Any] | None = None,
        store: str | os.PathLike[str] | None = None,
        part_of_thread: bool = False,
        seed: int | None = None,
    ) -> None:
        self._part = part_of_thread
        self._seed = seed
        if (thread is None) != (store is None):
            raise UsageError(
                "capture(thread=..., store=...) go together: the thread names the run, the "
                "store is the folder that keeps its trajectory while it waits at an interrupt"
            )
        self._thread = thread_id_of(thread) if thread is not None else None
        self._store = ThreadStore(store) if store is not None else None
        self._loaded = False
        if self._thread is not None and self._store is not None and trajectory is None:
            trajectory = self._store.load(self._thread)
            self._loaded = trajectory is not None
        self.handler = TrajectoryCallback(trajectory, train_nodes=train_nodes)
        if metadata:
            self.handler.trajectory.metadata.update(metadata)
        self._token: contextvars.Token[TrajectoryCallback | None] | None = None

    def __enter__(self) -> Trajectory:
        outer = _CURRENT.get()
        if self._seed is not None:  # a resumed thread's requests go on from its calls
            done = itertools.count(len(self.handler.trajectory.calls))
            self.handler.request_seeds = map(partial(derive_seed, self._seed), done)
        elif outer is not None:  # a block inside a seeded one draws from its seeds
            self.handler.request_seeds = outer.request_seeds
        self._token = _CURRENT.set(self.handler)
        return self.handler.trajectory

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
        handler, traj = self.handler, self.handler.trajectory
        if exc is not None:
            handler._set_exception(exc)
        handler.finish()
        _check_train_nodes(handler)
        if self._store is None or self._thread is None:
            if handler.resumed and exc is None and not self._part:
                _note(
                    traj,
                    "this run was resumed from an interrupt, but capture() was not given "
                    "thread= and store=: the trajectory holds only the calls after the "
                    "interrupt",
                )
            return
        if handler.resumed and not self._loaded:
            if exc is None:
                raise UsageError(
                    f"thread {self._thread!r} was resumed from an interrupt, but "
                    f"{self._store.path} holds no trajectory for it: its calls before the "
                    "interrupt are lost, so it would train as a fresh run. Start the thread "
                    "under the same capture(thread=..., store=...), or leave this run out"
                )
            return
        if traj.interrupted:
            self._store.save(self._thread, traj)
        else:
            self._store.discard(self._thread)

    async def __aenter__(self) -> Trajectory:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


def _check_train_nodes(handler: TrajectoryCallback) -> None:
    """Warn when `train_nodes` (names or a predicate) left every call of the trainable
    model out. A name that matched nothing while others did is checked over a whole step,
    at train time (`training.prepare.check_train_nodes`): one run may skip a node."""
    if handler.train_nodes is None:
        return
    names = getattr(handler.train_nodes, "names", None)
    calls = handler.trajectory.calls
    excluded = [c for c in calls if c.metadata.get("art_excluded") == "train_nodes"]
    if not excluded or any(c.trainable for c in calls):
        return
    ran = sorted({c.node or "(outside a graph)" for c in excluded})
    what = (
        f"train_nodes={sorted(names)} named no node that called the trainable model"
        if names is not None
        else "the train_nodes predicate selected no call of the trainable model"
    )
    _note(
        handler.trajectory,
        f"{what} in this run, so nothing of it trains; the nodes that called it: {ran}",
    )


def _note(traj: Trajectory, message: str) -> None:
    """A warning the user sees once per place, also kept in the trajectory's logs."""
    warnings.warn(message, UserWarning, stacklevel=3)
    traj.logs.append(message)
