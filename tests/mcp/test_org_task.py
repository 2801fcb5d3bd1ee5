"""The two-hop task: held-out entities and wordings, a server whose manager field chains,
and a reward that pays only an answer a lookup returned."""

from __future__ import annotations

import sys

import art_langgraph as art
from art_mcp import MCPToolset
from art_mcp.scenarios import Scenario, split_scenarios
from examples.mcp_org.server import org
from examples.mcp_org.tasks import build, score


def test_held_out_scenarios_share_no_entity_or_phrasing_with_training() -> None:
    train, val = split_scenarios(build())
    assert (len(train), len(val)) == (600, 280)
    assert sum(s.metadata["hops"] == 2 for s in val) == 120
    seen = {w for s in train for look in s.metadata["lookups"] for w in look["person"].split()}
    for s in val:  # neither the person asked about nor their manager, by any name part
        assert not any(w in seen for look in s.metadata["lookups"] for w in look["person"].split())

    def wording(s: Scenario) -> str:
        return s.task.replace(s.metadata["lookups"][0]["person"], "{}")

    assert not {wording(s) for s in val} & {wording(s) for s in train}
    assert build() == build()  # the same in every process


async def test_a_manager_is_looked_up_and_then_looked_up_in_turn() -> None:
    person = next(p for p in org().values() if p["split"] == "val")
    manager = org()[person["manager"].lower()]
    assert manager["split"] == "val"
    async with MCPToolset(f"{sys.executable} -m examples.mcp_org.server") as tools:
        assert [t.name for t in tools.tools] == ["lookup"]
        first = await tools.call("lookup", {"person": person["name"], "field": "manager"})
        assert first.text == f"{person['name']}'s manager: {manager['name']}."
        second = await tools.call("lookup", {"person": manager["name"], "field": "office"})
        assert second.text == f"{manager['name']}'s office: {manager['office']}."
        bad = await tools.call("lookup", {"person": "Nobody Here", "field": "team"})
        assert bad.is_error and "no one named" in bad.text


def test_the_reward_pays_an_answer_only_when_a_lookup_returned_it() -> None:
    s = next(s for s in build() if s.split == "val" and s.metadata["hops"] == 2)
    first, second = s.metadata["lookups"]
    hop1 = art.ToolEvent(name="lookup", args=first, result=f"x's manager: {second['person']}.")
    hop2 = art.ToolEvent(name="lookup", args=second, result=f"y's {second['field']}: {s.answer}.")

    def traj(answer: str, *events: art.ToolEvent) -> art.Trajectory:
        t = art.Trajectory(metadata={"answer": answer})
        t.tool_events.extend(events)
        return t

    solved = traj(f"It is {s.answer}.", hop1, hop2)
    assert score(solved, s) == 1.0 and solved.metrics == {"right_without_lookup": False, "hops": 2}
    guessed = traj(s.answer, hop1)  # right, but no lookup returned it
    assert score(guessed, s) == 0.1 and guessed.metrics["right_without_lookup"] is True
    other = next(p for p in org().values() if p[second["field"]] != s.answer)[second["field"]]
    assert score(traj(f"{s.answer} or {other}", hop1, hop2), s) == 0.2  # hedged: not right
    # a one-hop manager question: the answer may repeat the person asked about
    m = next(s for s in build() if s.metadata["field"] == "manager")
    (look,) = m.metadata["lookups"]
    got = art.ToolEvent(name="lookup", args=look, result=f"{look['person']}'s manager: {m.answer}.")
    assert score(traj(f"{look['person']}'s manager is {m.answer}.", got), m) == 1.0
