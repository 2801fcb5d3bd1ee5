"""`PerLoop`: one value per event loop, and a closed loop's value is dropped."""

from __future__ import annotations

import asyncio

from art_langgraph.runtime.event_loops import PerLoop


def test_one_value_per_loop_and_closed_loops_are_forgotten() -> None:
    made: list[object] = []

    def make() -> object:
        made.append(object())
        return made[-1]

    per = PerLoop(make)

    async def twice() -> tuple[object, object]:
        return per.get(), per.get()

    a1, a2 = asyncio.run(twice())
    assert a1 is a2 and len(made) == 1
    b1, _ = asyncio.run(twice())  # a new loop: a new value; the first loop is closed
    assert b1 is not a1 and len(made) == 2
    assert len(per) == 1  # the closed loop's value is gone
