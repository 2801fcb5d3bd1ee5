"""Tests for art_langgraph.gathering.gather: concurrency, exception limits, after_each, progress bar.

Rollouts are plain coroutines returning `Trajectory(reward=...)`; no server or model.
Anything that could hang waits under `asyncio.wait_for`, so a failure fails fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from art_langgraph import (
    Trajectory,
    TrajectoryGroup,
    UsageError,
    gather_trajectories,
    gather_trajectory_groups,
)

TIMEOUT_S = 2.0


async def returns(reward: float, **metadata: object) -> Trajectory:
    await asyncio.sleep(0)
    return Trajectory(reward=reward, metadata=dict(metadata))


async def raises(message: str = "boom") -> Trajectory:
    await asyncio.sleep(0)
    raise ValueError(message)


def run(aw: Awaitable[object]) -> Awaitable[object]:
    return asyncio.wait_for(aw, TIMEOUT_S)


class Barrier:
    """Every rollout must arrive before any may leave: deadlocks unless all run at once."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.all_here = asyncio.Event()

    async def rollout(self, reward: float, **metadata: object) -> Trajectory:
        self.arrived += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.arrived == self.parties:
            self.all_here.set()
        await self.all_here.wait()
        self.in_flight -= 1
        return Trajectory(reward=reward, metadata=dict(metadata))


# --- concurrency and structure ----------------------------------------------------------


async def test_all_rollouts_of_all_groups_run_concurrently() -> None:
    barrier = Barrier(parties=3 * 4)
    groups = [
        TrajectoryGroup(barrier.rollout(g * 10 + i, group=g, i=i) for i in range(4))
        for g in range(3)
    ]
    out = await run(gather_trajectory_groups(groups, progress=False))
    assert barrier.max_in_flight == 12
    assert len(out) == 3
    for g, group in enumerate(out):
        # Each result group holds exactly its own rollouts, in submission order.
        assert [t.metadata for t in group] == [{"group": g, "i": i} for i in range(4)]
        assert group.rewards() == [g * 10 + i for i in range(4)]
        assert not group.exceptions


async def test_sequential_rollouts_would_deadlock_the_barrier() -> None:
    """Guard for the barrier itself: one at a time, it never releases."""
    barrier = Barrier(parties=2)

    async def one_by_one() -> None:
        await barrier.rollout(0)
        await barrier.rollout(1)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(one_by_one(), 0.05)


async def test_existing_trajectories_exceptions_and_metadata_are_kept() -> None:
    done = Trajectory(reward=0.5)
    group = TrajectoryGroup(
        [done, RuntimeError("earlier"), returns(1.0), returns(2.0)],
        metadata={"prompt_id": "p7", "nested": {"k": [1, 2]}},
    )
    (out,) = await run(gather_trajectory_groups([group], progress=False))
    assert out.trajectories[0] is done
    assert out.rewards() == [0.5, 1.0, 2.0]
    assert out.metadata == {"prompt_id": "p7", "nested": {"k": [1, 2]}}
    assert [(e.type, e.message) for e in out.exceptions] == [("RuntimeError", "earlier")]
    assert not out.pending


async def test_groups_given_as_a_generator_and_empty_groups() -> None:
    out = await run(
        gather_trajectory_groups(
            (TrajectoryGroup(returns(float(n)) for _ in range(n)) for n in (2, 0, 1)),
            progress=False,
        )
    )
    assert [len(g) for g in out] == [2, 0, 1]
    assert await run(gather_trajectory_groups([], progress=False)) == []


async def test_gather_trajectories_returns_a_flat_list() -> None:
    barrier = Barrier(parties=5)
    out = await run(gather_trajectories((barrier.rollout(i) for i in range(5)), progress=False))
    assert isinstance(out, list)
    assert all(isinstance(t, Trajectory) for t in out)
    assert [t.reward for t in out] == [0, 1, 2, 3, 4]
    assert barrier.max_in_flight == 5


async def test_gather_trajectories_leaves_out_failures_within_the_limit() -> None:
    out = await run(
        gather_trajectories(
            [returns(1.0), raises(), returns(3.0)], progress=False, max_exceptions=1
        )
    )
    assert [t.reward for t in out] == [1.0, 3.0]
    with pytest.raises(ValueError, match="boom"):
        await run(gather_trajectories([returns(1.0), raises()], progress=False))


# --- exceptions --------------------------------------------------------------------------


async def test_raising_rollout_is_recorded_on_its_group_and_left_out() -> None:
    groups = [
        TrajectoryGroup([returns(1.0), raises("bad tool call"), returns(2.0)]),
        TrajectoryGroup([returns(3.0)]),
    ]
    a, b = await run(gather_trajectory_groups(groups, progress=False, max_exceptions=1))
    assert a.rewards() == [1.0, 2.0]
    assert len(a.exceptions) == 1
    info = a.exceptions[0]
    assert (info.type, info.message) == ("ValueError", "bad tool call")
    assert "ValueError: bad tool call" in info.traceback
    assert b.rewards() == [3.0]
    assert b.exceptions == []


async def test_max_exceptions_zero_reraises_the_first_exception() -> None:
    first = ValueError("first")

    async def fails_now() -> Trajectory:
        raise first

    async def fails_later() -> Trajectory:
        for _ in range(5):
            await asyncio.sleep(0)
        raise ValueError("second")

    for kwargs in ({}, {"max_exceptions": 0}):
        groups = [TrajectoryGroup([fails_later()]), TrajectoryGroup([returns(1.0), fails_now()])]
        with pytest.raises(ValueError) as info:
            await run(gather_trajectory_groups(groups, progress=False, **kwargs))
        assert info.value is first
        for _ in range(10):  # let the abandoned rollout finish before the next round
            await asyncio.sleep(0)


@pytest.mark.parametrize(("max_exceptions", "failures", "ok"), [(2, 2, True), (2, 3, False)])
async def test_integer_max_exceptions_allows_that_many(
    max_exceptions: int, failures: int, ok: bool
) -> None:
    groups = [
        TrajectoryGroup([returns(0.0), raises(f"e{g}")] if g < failures else [returns(0.0)])
        for g in range(4)
    ]
    gathered = gather_trajectory_groups(groups, progress=False, max_exceptions=max_exceptions)
    if ok:
        out = await run(gathered)
        assert sum(len(g.exceptions) for g in out) == failures
        assert sum(len(g) for g in out) == 4
    else:
        with pytest.raises(ValueError, match=r"^e\d$"):
            await run(gathered)


@pytest.mark.parametrize(
    ("fraction", "allowed"),
    [(0.25, 2), (0.3, 2), (0.2, 1), (0.9, 7)],  # floor(fraction * 8 rollouts)
)
@pytest.mark.parametrize("over", [False, True])
async def test_fractional_max_exceptions_is_a_share_of_all_rollouts(
    fraction: float, allowed: int, over: bool
) -> None:
    # Eight rollouts in two groups of four; `allowed` failures pass, one more raises.
    failures = allowed + 1 if over else allowed
    flags = [i < failures for i in range(8)]
    groups = [
        TrajectoryGroup(raises() if f else returns(1.0) for f in flags[:4]),
        TrajectoryGroup(raises() if f else returns(1.0) for f in flags[4:]),
    ]
    gathered = gather_trajectory_groups(groups, progress=False, max_exceptions=fraction)
    if over:
        with pytest.raises(ValueError, match="boom"):
            await run(gathered)
    else:
        out = await run(gathered)
        assert [len(g.exceptions) for g in out] == [sum(flags[:4]), sum(flags[4:])]
        assert sum(len(g) for g in out) == 8 - failures


async def test_fractional_limit_counts_failures_across_groups() -> None:
    # 2 failures allowed in total, spread over groups: the third, in another group, raises.
    groups = [TrajectoryGroup([raises(f"g{g}"), returns(1.0)]) for g in range(3)]
    groups.append(TrajectoryGroup([returns(1.0), returns(1.0)]))
    with pytest.raises(ValueError, match=r"^g\d$"):
        await run(gather_trajectory_groups(groups, progress=False, max_exceptions=0.25))


async def test_negative_max_exceptions_is_a_usage_error() -> None:
    async def never_awaited() -> Trajectory:  # pragma: no cover - must not run
        raise AssertionError("ran a rollout despite a usage error")

    for bad in (-1, -0.5):
        coro = never_awaited()
        with pytest.raises(UsageError, match="max_exceptions"):
            await run(
                gather_trajectory_groups(
                    [TrajectoryGroup([coro])], progress=False, max_exceptions=bad
                )
            )
        coro.close()


async def test_non_trajectory_result_is_recorded_as_an_exception() -> None:
    async def returns_a_dict() -> object:
        return {"reward": 1.0}

    group = TrajectoryGroup([returns(1.0), returns_a_dict()])
    (out,) = await run(gather_trajectory_groups([group], progress=False, max_exceptions=1))
    assert out.rewards() == [1.0]
    (info,) = out.exceptions
    assert info.type == "art_langgraph.errors.UsageError"
    assert info.message == "a rollout returned dict, not a Trajectory"
    with pytest.raises(UsageError, match="returned dict, not a Trajectory"):
        await run(gather_trajectory_groups([TrajectoryGroup([returns_a_dict()])], progress=False))


async def test_cancellation_of_a_rollout_is_not_swallowed() -> None:
    async def cancelled() -> Trajectory:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await run(
            gather_trajectory_groups(
                [TrajectoryGroup([cancelled()])], progress=False, max_exceptions=10
            )
        )


async def test_exceeding_the_limit_raises_without_waiting_for_siblings() -> None:
    release = asyncio.Event()

    async def slow() -> Trajectory:
        await release.wait()
        return Trajectory(reward=1.0)

    group = TrajectoryGroup([raises("fail fast"), slow()])
    try:
        with pytest.raises(ValueError, match="fail fast"):
            await asyncio.wait_for(gather_trajectory_groups([group], progress=False), 0.5)
    finally:
        release.set()
        await asyncio.sleep(0)


async def test_exceeding_the_limit_cancels_the_other_rollouts() -> None:
    release = asyncio.Event()
    state = {"cancelled": False, "finished": False}

    async def slow() -> Trajectory:
        try:
            await release.wait()
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        state["finished"] = True
        return Trajectory(reward=1.0)

    groups = [TrajectoryGroup([raises("stop")]), TrajectoryGroup([slow()])]
    try:
        with pytest.raises(ValueError, match="stop"):
            await run(gather_trajectory_groups(groups, progress=False))
        for _ in range(5):
            await asyncio.sleep(0)
        assert state["cancelled"]
    finally:
        release.set()
        for _ in range(5):
            await asyncio.sleep(0)


# --- after_each --------------------------------------------------------------------------


def _rescored(group: TrajectoryGroup) -> TrajectoryGroup:
    for t in group:
        t.reward = t.reward * 10
    return group


async def test_after_each_sync_and_async_hooks_see_each_finished_group() -> None:
    seen: list[tuple[str, object, list[float]]] = []

    def sync_hook(group: TrajectoryGroup) -> TrajectoryGroup:
        seen.append(("sync", group.metadata["id"], group.rewards()))
        return group

    async def async_hook(group: TrajectoryGroup) -> TrajectoryGroup:
        await asyncio.sleep(0)
        seen.append(("async", group.metadata["id"], group.rewards()))
        return group

    for hook, kind in ((sync_hook, "sync"), (async_hook, "async")):
        seen.clear()
        groups = [
            TrajectoryGroup([returns(1.0), returns(2.0)], metadata={"id": "a"}),
            TrajectoryGroup([returns(3.0)], metadata={"id": "b"}),
        ]
        out = await run(gather_trajectory_groups(groups, progress=False, after_each=hook))
        assert sorted(seen) == [(kind, "a", [1.0, 2.0]), (kind, "b", [3.0])]
        assert [g.metadata["id"] for g in out] == ["a", "b"]
        assert all(not g.pending for g in out)


@pytest.mark.parametrize("is_async", [False, True])
async def test_after_each_returning_a_rescored_group_replaces_it(is_async: bool) -> None:
    async def async_rescored(group: TrajectoryGroup) -> TrajectoryGroup:
        return _rescored(group)

    hook = async_rescored if is_async else _rescored
    groups = [TrajectoryGroup([returns(1.0), returns(2.0)]), TrajectoryGroup([returns(3.0)])]
    out = await run(gather_trajectory_groups(groups, progress=False, after_each=hook))
    assert [g.rewards() for g in out] == [[10.0, 20.0], [30.0]]


async def test_after_each_returning_a_new_group_replaces_it() -> None:
    def replace(group: TrajectoryGroup) -> TrajectoryGroup:
        best = max(group, key=lambda t: t.reward)
        return TrajectoryGroup([best], metadata={**group.metadata, "kept": "best"})

    groups = [TrajectoryGroup([returns(1.0), returns(5.0), returns(2.0)], metadata={"id": 1})]
    (out,) = await run(gather_trajectory_groups(groups, progress=False, after_each=replace))
    assert out.rewards() == [5.0]
    assert out.metadata == {"id": 1, "kept": "best"}


@pytest.mark.parametrize("is_async", [False, True])
async def test_after_each_returning_none_drops_the_group(is_async: bool) -> None:
    def drop_uniform(group: TrajectoryGroup) -> TrajectoryGroup | None:
        return None if len(set(group.rewards())) == 1 else group

    async def async_drop_uniform(group: TrajectoryGroup) -> TrajectoryGroup | None:
        return drop_uniform(group)

    hook = async_drop_uniform if is_async else drop_uniform
    groups = [
        TrajectoryGroup([returns(1.0), returns(1.0)], metadata={"id": "same"}),
        TrajectoryGroup([returns(0.0), returns(1.0)], metadata={"id": "mixed"}),
        TrajectoryGroup([returns(0.0), returns(0.0)], metadata={"id": "zero"}),
    ]
    out = await run(gather_trajectory_groups(groups, progress=False, after_each=hook))
    assert [g.metadata["id"] for g in out] == ["mixed"]


@pytest.mark.parametrize("is_async", [False, True])
async def test_after_each_returning_a_list_splits_the_group(is_async: bool) -> None:
    def split(group: TrajectoryGroup) -> list[TrajectoryGroup]:
        return [
            TrajectoryGroup([t], metadata={**group.metadata, "part": i})
            for i, t in enumerate(group)
        ]

    async def async_split(group: TrajectoryGroup) -> list[TrajectoryGroup]:
        return split(group)

    hook = async_split if is_async else split
    groups = [
        TrajectoryGroup([returns(1.0), returns(2.0)], metadata={"id": "a"}),
        TrajectoryGroup([returns(3.0)], metadata={"id": "b"}),
    ]
    out = await run(gather_trajectory_groups(groups, progress=False, after_each=hook))
    assert [(g.metadata["id"], g.metadata["part"], g.rewards()) for g in out] == [
        ("a", 0, [1.0]),
        ("a", 1, [2.0]),
        ("b", 0, [3.0]),
    ]


async def test_after_each_sees_the_recorded_exceptions() -> None:
    seen: list[list[str]] = []

    def hook(group: TrajectoryGroup) -> TrajectoryGroup:
        seen.append([e.message for e in group.exceptions])
        return group

    groups = [TrajectoryGroup([returns(1.0), raises("x")])]
    await run(gather_trajectory_groups(groups, progress=False, max_exceptions=1, after_each=hook))
    assert seen == [["x"]]


# --- progress bar ------------------------------------------------------------------------


async def test_progress_false_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    groups = [TrajectoryGroup([returns(1.0), raises()])]
    await run(gather_trajectory_groups(groups, progress=False, max_exceptions=1))
    await run(gather_trajectories([returns(1.0)], progress=False))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ""


async def test_progress_true_shows_reward_mean_and_exceptions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    groups = [
        TrajectoryGroup([returns(1.0), returns(0.0), raises()]),
        TrajectoryGroup([returns(0.5)]),
    ]
    await run(
        gather_trajectory_groups(groups, progress=True, max_exceptions=1, pbar_desc="my-gather")
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    final = captured.err.rstrip().replace("\r", "\n").splitlines()[-1]
    assert "my-gather" in final
    assert "4/4" in final
    assert "reward=0.500" in final  # mean of 1.0, 0.0 and 0.5; the failure is not a reward
    assert "exceptions=1" in final
