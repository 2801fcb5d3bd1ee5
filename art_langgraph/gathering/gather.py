"""Gathering rollouts: `gather_trajectory_groups`, `gather_trajectories`, with a progress bar.

Each group holds the awaitables of its rollouts (`TrajectoryGroup(rollout(s) for _ in
range(8))`). All rollouts of all groups run concurrently; the bar shows how many are
done, the running mean reward and the exceptions so far. A rollout that raises is
recorded on its group (`group.exceptions`) instead of a trajectory; more than
`max_exceptions` of them (a count, or a fraction of all rollouts when < 1) re-raises
the first one. `after_each(group)` runs as each group completes and may rescore it,
return a replacement, a list of groups (a split), or None to drop it; it may be async.

Left out: retries (wrap the rollout yourself) and distributed execution.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from art_langgraph.errors import UsageError
from art_langgraph.trajectories.trajectory import ExceptionInfo, Trajectory, TrajectoryGroup

AfterEach = Callable[
    [TrajectoryGroup], "TrajectoryGroup | list[TrajectoryGroup] | Awaitable[Any] | None"
]


class _Progress:
    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.rewards: list[float] = []
        self.exceptions = 0
        self.bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="rollout", dynamic_ncols=True)

    def update(self, result: Trajectory | BaseException) -> None:
        if isinstance(result, BaseException):
            self.exceptions += 1
        else:
            self.rewards.append(result.reward)
        if self.bar is not None:
            mean = sum(self.rewards) / len(self.rewards) if self.rewards else float("nan")
            self.bar.set_postfix(reward=f"{mean:.3f}", exceptions=self.exceptions, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _limit(max_exceptions: float, total: int) -> float:
    if max_exceptions < 0:
        raise UsageError(f"max_exceptions must be >= 0, got {max_exceptions}")
    return math.floor(max_exceptions * total) if 0 < max_exceptions < 1 else max_exceptions


async def _one(aw: Awaitable[Trajectory], progress: _Progress) -> Trajectory | BaseException:
    try:
        result = await aw
        if not isinstance(result, Trajectory):
            raise UsageError(f"a rollout returned {type(result).__name__}, not a Trajectory")
    except (Exception, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError):
            raise
        result_exc: BaseException = exc
        progress.update(result_exc)
        return result_exc
    progress.update(result)
    return result


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup],
    *,
    pbar_desc: str = "gather",
    progress: bool = True,
    max_exceptions: float = 0,
    after_each: AfterEach | None = None,
) -> list[TrajectoryGroup]:
    """Run every group's rollouts concurrently; returns the finished groups (see module doc)."""
    groups = list(groups)
    pending = [g.awaitables() for g in groups]
    for g in groups:
        g._pending = []  # consumed here; the returned groups hold the results
    total = sum(len(p) for p in pending)
    limit = _limit(max_exceptions, total)
    bar = _Progress(total, pbar_desc, progress)
    failures: list[BaseException] = []
    tasks: list[asyncio.Future[Trajectory | BaseException]] = []

    async def one(aw: Awaitable[Trajectory]) -> Trajectory | BaseException:
        result = await _one(aw, bar)
        if not isinstance(result, Trajectory):
            failures.append(result)
            if len(failures) > limit:
                raise failures[0]  # at once: the caller does not wait for the other rollouts
        return result

    async def run_group(
        group: TrajectoryGroup, aws: list[Awaitable[Trajectory]]
    ) -> list[TrajectoryGroup]:
        mine = [asyncio.ensure_future(one(a)) for a in aws]
        tasks.extend(mine)
        results = await asyncio.gather(*mine)
        done = TrajectoryGroup(
            [*group.trajectories, *(r for r in results if isinstance(r, Trajectory))],
            metadata=dict(group.metadata),
            exceptions=[
                *group.exceptions,
                *(
                    ExceptionInfo.from_exception(r)
                    for r in results
                    if not isinstance(r, Trajectory)
                ),
            ],
        )
        if after_each is None:
            return [done]
        out = after_each(done)
        if inspect.isawaitable(out):
            out = await out
        if out is None:
            return []
        return list(out) if isinstance(out, list | tuple) else [out]

    outer: list[asyncio.Future[list[TrajectoryGroup]]] = [
        asyncio.ensure_future(run_group(g, p)) for g, p in zip(groups, pending, strict=True)
    ]
    try:
        nested = await asyncio.gather(*outer)
    except BaseException:
        # Too many failures (or the caller was cancelled): stop every rollout still running.
        for t in outer:
            t.cancel()
        for r in tasks:
            r.cancel()
        await asyncio.gather(*outer, *tasks, return_exceptions=True)
        raise
    finally:
        bar.close()
    return [g for gs in nested for g in gs]


async def gather_trajectories(
    rollouts: Iterable[Awaitable[Trajectory]],
    *,
    pbar_desc: str = "gather",
    progress: bool = True,
    max_exceptions: float = 0,
) -> list[Trajectory]:
    """Run rollouts concurrently; returns the trajectories (failed rollouts are left out and counted)."""
    (group,) = await gather_trajectory_groups(
        [TrajectoryGroup(rollouts)],
        pbar_desc=pbar_desc,
        progress=progress,
        max_exceptions=max_exceptions,
    )
    return list(group)
