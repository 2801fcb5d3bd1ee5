"""The two-hop task: held-out entities and wordings, a server whose project lead chains into
a lookup, and a reward that pays only an answer a lookup returned."""

from __future__ import annotations

import json
import sys

import art_langgraph as art
from art_mcp import MCPToolset
from art_mcp.scenarios import Scenario, split_scenarios
from examples.mcp_org.server import org, projects
from examples.mcp_org.tasks import N_DEMONSTRATIONS, TAUGHT_EVERY, build, score


def test_held_out_scenarios_share_no_entity_or_phrasing_with_training() -> None:
    train, val = split_scenarios(build())
    assert (len(train), len(val)) == (516, 248)
    assert sum(s.metadata["hops"] == 2 for s in val) == 96

    def names(s: Scenario) -> set[str]:
        """Every name part of the entities its calls name: project, lead, person."""
        args = [c["args"] for c in s.metadata["calls"]]
        return {w for a in args for k in ("project", "person") for w in a.get(k, "").split()}

    seen = {w for s in train for w in names(s)}
    for s in val:  # neither the project, nor its lead, nor the person, by any name part
        assert not names(s) & seen, s.id

    def wording(s: Scenario) -> str:
        return s.task.replace(s.metadata["entity"], "{}")

    assert not {wording(s) for s in val} & {wording(s) for s in train}
    assert all(s.metadata["phrasing"] == wording(s) for s in build())
    assert build() == build()  # the same in every process


def test_its_validation_slice_holds_out_wordings_as_the_split_does() -> None:
    """A setting chosen on the validation slice meets new wordings, as held-out runs do."""
    from art_mcp.scenarios import validation_scenarios

    carved = validation_scenarios(build())
    val = [s for s in carved if s.split == "val"]
    train = [s for s in carved if s.split == "train"]
    assert sum(s.metadata["hops"] == 2 for s in val) >= 16
    for key in ("entity", "phrasing"):
        assert {s.metadata[key] for s in val}.isdisjoint(s.metadata[key] for s in train)


async def test_a_project_lead_is_looked_up_and_then_looked_up_in_turn() -> None:
    project = next(p for p in projects().values() if p["split"] == "val")
    lead = org()[project["lead"].lower()]
    assert lead["split"] == "val"
    async with MCPToolset(f"{sys.executable} -m examples.mcp_org.server") as tools:
        assert sorted(t.name for t in tools.tools) == ["lookup", "project_lead"]
        first = await tools.call("project_lead", {"project": project["name"]})
        assert first.text.startswith(f"Project {project['name']} is led by {lead['name']}.")
        second = await tools.call("lookup", {"person": lead["name"], "field": "office"})
        assert second.text == f"{lead['name']}'s office: {lead['office']}."
        bad = await tools.call("lookup", {"person": "Nobody Here", "field": "team"})
        assert bad.is_error and "no one named" in bad.text
        bad = await tools.call("project_lead", {"project": "Nothing"})
        assert bad.is_error and "no project" in bad.text
        # a training scenario's demonstration (the SFT warm start's) replays the server
        demo = next(s for s in build() if s.split == "train" and s.metadata["hops"] == 2)
        assert demo.demonstration is not None
        calls = [m["tool_calls"][0]["function"] for m in demo.demonstration if "tool_calls" in m]
        results = [m["content"] for m in demo.demonstration if m["role"] == "tool"]
        for call, result in zip(calls, results, strict=False):
            got = await tools.call(call["name"], json.loads(call["arguments"]))
            assert got.text == result
        assert calls[-1]["name"] == "complete_task" and demo.answer in calls[-1]["arguments"]
    assert all(s.demonstration is None for s in build() if s.split == "val")
    # the default warm start's demonstrations: 64 training scenarios, half of each slice
    shown = [s.metadata["slice"] for s in build() if s.demonstration is not None]
    assert len(shown) == N_DEMONSTRATIONS and shown.count("two-hop") == N_DEMONSTRATIONS // 2
    # ... about a third of the training projects and their leads: RL's other questions name
    # projects and leads no demonstration shows
    train = [s for s in build() if s.split == "train"]
    about = {s.metadata["entity"] for s in train if s.demonstration is not None}
    led = {p["name"]: p["lead"] for p in projects().values() if p["split"] == "train"}
    assert {p for p in led if p in about} == set(list(led)[::TAUGHT_EVERY])
    unshown = [p for p in led if p not in about]
    assert len(unshown) == len(led) - len(led) // TAUGHT_EVERY
    assert not {led[p] for p in unshown} & about


def test_the_reward_pays_an_answer_only_when_a_lookup_returned_it() -> None:
    s = next(s for s in build() if s.split == "val" and s.metadata["hops"] == 2)
    first, second = s.metadata["calls"]
    lead = second["args"]["person"]
    hop1 = art.ToolEvent(name=first["tool"], args=first["args"], result=f"led by {lead}.")
    hop2 = art.ToolEvent(name="lookup", args=second["args"], result=f"x: {s.answer}.")

    def traj(answer: str, *events: art.ToolEvent) -> art.Trajectory:
        t = art.Trajectory(metadata={"answer": answer})
        t.tool_events.extend(events)
        return t

    solved = traj(f"It is {s.answer}.", hop1, hop2)
    assert score(solved, s) == 1.0 and solved.metrics == {"right_without_lookup": False, "hops": 2}
    guessed = traj(s.answer, hop1)  # right, but no lookup returned it
    assert score(guessed, s) == 0.1 and guessed.metrics["right_without_lookup"] is True
    field = second["args"]["field"]
    other = next(p for p in org().values() if p[field] != s.answer)[field]
    assert score(traj(f"{s.answer} or {other}", hop1, hop2), s) == 0.2  # hedged: not right
    # a one-hop lead question: the answer is a person
    m = next(s for s in build() if s.metadata["field"] == "lead")
    (look,) = m.metadata["calls"]
    got = art.ToolEvent(name=look["tool"], args=look["args"], result=f"led by {m.answer}.")
    assert score(traj(f"{m.answer} leads it.", got), m) == 1.0
