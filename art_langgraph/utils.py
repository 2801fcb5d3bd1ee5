"""Dataset iteration and concurrency helpers, with ART's names.

`iterate_dataset(items, groups_per_step=..., num_epochs=..., initial_step=...)` yields
one `DatasetBatch` per training step, shuffling each epoch with its own
`random.Random(seed + epoch)` (the global random state is never touched), and can
resume from a step. `limit_concurrency(n)` bounds how many calls of an async function
run at once. `atomic_write(path)` is the one way files are saved: readers see the old
file or the new one, never half of one.

Left out: streaming datasets of unknown length.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import random
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, ParamSpec, TypeVar

from art_langgraph.errors import UsageError
from art_langgraph.runtime.event_loops import PerLoop

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class DatasetBatch(Generic[T]):
    """The items of one training step."""

    items: list[T]
    step: int
    """Global step index, from 0 (matches `initial_step` when resuming)."""
    epoch: int
    epoch_step: int
    """Step index within the epoch."""


def iterate_dataset(
    items: Sequence[T],
    *,
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> Iterator[DatasetBatch[T]]:
    """Batches of `groups_per_step` items, epoch after epoch (see module doc)."""
    if groups_per_step < 1 or num_epochs < 1 or initial_step < 0:
        raise UsageError(
            f"groups_per_step and num_epochs must be >= 1 and initial_step >= 0; got "
            f"{groups_per_step}, {num_epochs}, {initial_step}"
        )
    n = len(items)
    per_epoch = n // groups_per_step if drop_last else math.ceil(n / groups_per_step)
    step = 0
    for epoch in range(num_epochs):
        order = list(range(n))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for k in range(per_epoch):
            if step >= initial_step:
                idx = order[k * groups_per_step : (k + 1) * groups_per_step]
                yield DatasetBatch([items[i] for i in idx], step, epoch, k)
            step += 1


def limit_concurrency(n: int) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorator: at most `n` calls of the async function run at once (per event loop)."""
    if n < 1:
        raise UsageError(f"limit_concurrency needs n >= 1, got {n}")

    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        semaphores = PerLoop(lambda: asyncio.Semaphore(n))

        @functools.wraps(fn)
        async def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            async with semaphores.get():
                return await fn(*args, **kwargs)

        return inner

    return wrap


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Write `path` through a temp file beside it: on a clean exit it is flushed, fsynced
    and renamed over `path` (keeping the old file's mode, else 0644); on an error it is
    removed and `path` is untouched. Text mode is UTF-8 with "\n" line ends."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:  # mkstemp makes the file 0600
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o644)
        text: dict[str, Any] = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
        with os.fdopen(fd, mode, **text) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
