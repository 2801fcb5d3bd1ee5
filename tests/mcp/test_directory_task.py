"""The staff-directory task: its generator holds out people and phrasings, its server
answers over stdio, its reward pays for the answer and a little for the right lookup."""

from __future__ import annotations

import sys

import art_langgraph as art
from art_mcp import MCPToolset
from art_mcp.scenarios import split_scenarios
from examples.mcp_directory.server import directory
from examples.mcp_directory.tasks import PHRASINGS, build, candidates, score


def test_held_out_scenarios_share_no_name_or_phrasing_with_training() -> None:
    train, val = split_scenarios(build())
    assert len(val) >= 150 and len(train) >= 150
    words = {w for s in train for w in s.metadata["args"]["person"].split()}
    assert not any(w in words for s in val for w in s.metadata["args"]["person"].split())

    def phrasing(task: str, name: str) -> str:
        return task.replace(name, "{}")

    seen = {phrasing(s.task, s.metadata["args"]["person"]) for s in train}
    assert not any(phrasing(s.task, s.metadata["args"]["person"]) in seen for s in val)
    assert len({p for ps in PHRASINGS.values() for p in ps}) == 24
    assert build() == build()  # the same in every process


async def test_the_server_looks_people_up() -> None:
    person = next(p for p in directory().values() if p["split"] == "val")
    async with MCPToolset(f"{sys.executable} -m examples.mcp_directory.server") as tools:
        assert [t.name for t in tools.tools] == ["lookup"]
        schema = tools.tools[0].input_schema["properties"]
        assert person["name"] in schema["person"]["enum"]
        got = await tools.call("lookup", {"person": person["name"], "field": "office"})
        fact = f"{person['name']}'s office: {person['office']}. Now call complete_task with it."
        assert (got.text, got.is_error) == (fact, False)
        bad = await tools.call("lookup", {"person": "Nobody Here", "field": "team"})
        assert bad.is_error and "no one named" in bad.text


def test_reward() -> None:
    s = next(s for s in build() if s.split == "val")
    args = s.metadata["args"]

    def traj(answer: str, *events: art.ToolEvent) -> art.Trajectory:
        t = art.Trajectory(metadata={"answer": answer})
        t.tool_events.extend(events)
        return t

    right = art.ToolEvent(name="lookup", args=args, result=s.answer)
    assert score(traj(f"It is {s.answer}.", right), s) == 1.0
    assert score(traj("no idea", right), s) == 0.2
    wrong = art.ToolEvent(name="lookup", args={**args, "field": "nope"}, error="unknown field")
    assert score(traj("no idea", wrong), s) == 0.0
    # right, but no lookup returned it: recall or a guess, not a success
    guessed = traj(f"It is {s.answer}.")
    assert score(guessed, s) == 0.0 and guessed.metrics["right_without_lookup"] is True
    other = next(c for c in candidates(s) if c != s.answer)
    assert score(traj(f"{s.answer} or {other}", right), s) == 0.2  # a hedge is not right
