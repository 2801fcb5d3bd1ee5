"""Tests for art_langgraph.utils: iterate_dataset (batching, shuffling, resume) and limit_concurrency."""

from __future__ import annotations

import asyncio
import gc
import random
import weakref
from collections import Counter
from pathlib import Path

import pytest

from art_langgraph.errors import UsageError
from art_langgraph.utils import DatasetBatch, iterate_dataset, limit_concurrency

ITEMS = [f"item{i}" for i in range(10)]


def by_epoch(batches: list[DatasetBatch[str]]) -> dict[int, list[DatasetBatch[str]]]:
    out: dict[int, list[DatasetBatch[str]]] = {}
    for b in batches:
        out.setdefault(b.epoch, []).append(b)
    return out


# --- iterate_dataset ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("drop_last", "sizes"),
    [(False, [3, 3, 3, 1]), (True, [3, 3, 3])],
)
def test_batch_sizes_and_count_per_epoch(drop_last: bool, sizes: list[int]) -> None:
    batches = list(iterate_dataset(ITEMS, groups_per_step=3, num_epochs=2, drop_last=drop_last))
    epochs = by_epoch(batches)
    assert sorted(epochs) == [0, 1]
    for epoch_batches in epochs.values():
        assert [len(b.items) for b in epoch_batches] == sizes


def test_exact_division_gives_full_batches_either_way() -> None:
    for drop_last in (False, True):
        batches = list(iterate_dataset(ITEMS, groups_per_step=5, drop_last=drop_last))
        assert [len(b.items) for b in batches] == [5, 5]


def test_every_item_exactly_once_per_epoch() -> None:
    batches = list(iterate_dataset(ITEMS, groups_per_step=3, num_epochs=3, seed=5))
    for epoch_batches in by_epoch(batches).values():
        seen = Counter(x for b in epoch_batches for x in b.items)
        assert seen == Counter(ITEMS)


def test_drop_last_leaves_out_only_the_remainder() -> None:
    batches = list(iterate_dataset(ITEMS, groups_per_step=3, num_epochs=2, drop_last=True))
    for epoch_batches in by_epoch(batches).values():
        seen = [x for b in epoch_batches for x in b.items]
        assert len(seen) == len(set(seen)) == 9
        assert set(seen) <= set(ITEMS)


def test_step_epoch_and_epoch_step_fields() -> None:
    batches = list(iterate_dataset(ITEMS, groups_per_step=4, num_epochs=3))
    assert [(b.step, b.epoch, b.epoch_step) for b in batches] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 0, 2),
        (3, 1, 0),
        (4, 1, 1),
        (5, 1, 2),
        (6, 2, 0),
        (7, 2, 1),
        (8, 2, 2),
    ]
    assert all(isinstance(b, DatasetBatch) for b in batches)


def test_shuffle_differs_between_epochs_but_is_reproducible() -> None:
    def orders(seed: int) -> list[list[str]]:
        batches = list(iterate_dataset(ITEMS, groups_per_step=3, num_epochs=3, seed=seed))
        return [[x for b in eb for x in b.items] for eb in by_epoch(batches).values()]

    first = orders(seed=1)
    assert first == orders(seed=1)
    assert first[0] != first[1] != first[2] != first[0]
    assert any(order != ITEMS for order in first)  # actually shuffled
    assert orders(seed=2)[0] != first[0]


def test_shuffle_false_keeps_order() -> None:
    batches = list(iterate_dataset(ITEMS, groups_per_step=4, num_epochs=2, shuffle=False))
    assert [b.items for b in batches] == [ITEMS[0:4], ITEMS[4:8], ITEMS[8:10]] * 2


def test_global_random_state_is_unchanged() -> None:
    random.seed(1234)
    before = random.getstate()
    list(iterate_dataset(ITEMS, groups_per_step=3, num_epochs=3, seed=9))
    assert random.getstate() == before


def test_global_random_state_does_not_affect_the_order() -> None:
    random.seed(1)
    a = [b.items for b in iterate_dataset(ITEMS, groups_per_step=3, num_epochs=2, seed=3)]
    random.seed(2)
    b = [b.items for b in iterate_dataset(ITEMS, groups_per_step=3, num_epochs=2, seed=3)]
    assert a == b


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("initial_step", [0, 1, 3, 4, 7, 11, 12, 50])
def test_initial_step_resumes_exactly_where_a_full_run_would_be(
    initial_step: int, drop_last: bool
) -> None:
    kwargs = dict(groups_per_step=3, num_epochs=3, seed=11, drop_last=drop_last)
    full = list(iterate_dataset(ITEMS, **kwargs))  # type: ignore[arg-type]
    resumed = list(iterate_dataset(ITEMS, initial_step=initial_step, **kwargs))  # type: ignore[arg-type]
    assert resumed == full[initial_step:]
    if resumed:
        assert resumed[0].step == initial_step


@pytest.mark.parametrize(
    "kwargs",
    [
        {"groups_per_step": 0},
        {"groups_per_step": -2},
        {"num_epochs": 0},
        {"num_epochs": -1},
        {"initial_step": -1},
    ],
)
def test_invalid_arguments_raise_usage_error(kwargs: dict[str, int]) -> None:
    with pytest.raises(UsageError):
        # iterate_dataset is a generator, so the check runs at the first next().
        next(iterate_dataset(ITEMS, **kwargs))  # type: ignore[arg-type]


def test_usage_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="groups_per_step"):
        list(iterate_dataset(ITEMS, groups_per_step=0))


# --- limit_concurrency -------------------------------------------------------------------


class Tracker:
    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0

    async def work(self, x: int) -> int:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            if x < 0:
                raise KeyError(x)
            return x * 2
        finally:
            self.in_flight -= 1


@pytest.mark.parametrize("n", [1, 3])
async def test_limit_concurrency_bounds_calls_in_flight(n: int) -> None:
    tracker = Tracker()
    limited = limit_concurrency(n)(tracker.work)
    results = await asyncio.wait_for(asyncio.gather(*(limited(i) for i in range(12))), 2.0)
    assert results == [i * 2 for i in range(12)]
    assert tracker.max_in_flight == n  # reached, never exceeded


async def test_unlimited_baseline_exceeds_the_bound() -> None:
    """Guard: without the decorator the same workload does overlap, so the bound is meaningful."""
    tracker = Tracker()
    await asyncio.gather(*(tracker.work(i) for i in range(12)))
    assert tracker.max_in_flight == 12


async def test_limit_concurrency_passes_exceptions_through_and_frees_the_slot() -> None:
    tracker = Tracker()
    limited = limit_concurrency(1)(tracker.work)
    with pytest.raises(KeyError):
        await asyncio.wait_for(limited(-1), 2.0)
    # The slot was released: further calls still run.
    assert await asyncio.wait_for(limited(4), 2.0) == 8
    results = await asyncio.wait_for(
        asyncio.gather(limited(1), limited(-2), limited(3), return_exceptions=True), 2.0
    )
    assert results[0] == 2 and results[2] == 6
    assert isinstance(results[1], KeyError)
    assert tracker.max_in_flight == 1


async def test_limit_concurrency_keeps_the_function_metadata() -> None:
    async def fetch(x: int) -> int:
        """Fetch x."""
        return x

    limited = limit_concurrency(2)(fetch)
    assert limited.__name__ == "fetch"
    assert limited.__doc__ == "Fetch x."
    assert await limited(x=5) == 5


def test_limit_concurrency_works_across_event_loops() -> None:
    tracker = Tracker()
    limited = limit_concurrency(2)(tracker.work)

    async def batch() -> list[int]:
        return await asyncio.wait_for(asyncio.gather(*(limited(i) for i in range(6))), 2.0)

    assert asyncio.run(batch()) == [0, 2, 4, 6, 8, 10]
    assert asyncio.run(batch()) == [0, 2, 4, 6, 8, 10]
    assert tracker.max_in_flight == 2


def test_limit_concurrency_does_not_keep_closed_event_loops_alive() -> None:
    limited = limit_concurrency(1)(Tracker().work)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def batch() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await asyncio.gather(limited(1), limited(2))  # contended, so the semaphore binds a loop

    for _ in range(3):
        asyncio.run(batch())
    gc.collect()
    # The most recent loop may stay cached until the next call; earlier ones must be freed.
    assert [ref() is None for ref in loops[:-1]] == [True, True]


@pytest.mark.parametrize("n", [0, -1])
def test_limit_concurrency_below_one_is_a_usage_error(n: int) -> None:
    with pytest.raises(UsageError, match="n >= 1"):
        limit_concurrency(n)


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    from art_langgraph.utils import atomic_write

    target = tmp_path / "report.json"
    target.write_text("old")
    target.chmod(0o640)
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]
    with atomic_write(target) as f:
        f.write("new")
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o640
    with atomic_write(tmp_path / "curve.png", "wb") as f:
        f.write(b"\x89PNG")
    assert (tmp_path / "curve.png").read_bytes() == b"\x89PNG"
    assert (tmp_path / "curve.png").stat().st_mode & 0o777 == 0o644
