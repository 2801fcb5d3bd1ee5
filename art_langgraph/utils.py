"""Dataset iteration and concurrency helpers, with ART's names.

`iterate_dataset(items, groups_per_step=..., num_epochs=..., initial_step=...)` yields
one `DatasetBatch` per training step, shuffling each epoch with its own
`random.Random(seed + epoch)` (the global random state is never touched), and can
resume from a step. `limit_concurrency(n)` bounds how many calls of an async function
run at once.

Left out: streaming datasets of unknown length.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from art_langgraph.errors import UsageError

__all__ = ["DatasetBatch", "iterate_dataset", "limit_concurrency"]

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
        semaphores: dict[Any, asyncio.Semaphore] = {}

        @functools.wraps(fn)
        async def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            loop = asyncio.get_running_loop()
            for stale in [lp for lp in semaphores if lp.is_closed()]:
                del semaphores[stale]  # never keep a finished loop alive
            sem = semaphores.setdefault(loop, asyncio.Semaphore(n))
            async with sem:
                return await fn(*args, **kwargs)

        return inner

    return wrap
