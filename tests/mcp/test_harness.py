"""Harness pieces that need no training: SFT items, the reward loader, the bundled scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import art_langgraph as art
from art_langgraph.errors import UsageError
from art_mcp.agent import SYSTEM, complete_task_tool, demonstrations
from art_mcp.evaluation import eval_sample
from art_mcp.scenarios import Scenario, load_scenarios
from art_mcp.scoring import load_reward
from examples.mcp_server import tasks

ROOT = Path(__file__).resolve().parents[2]


def test_bare_conversations_get_the_agents_system_prompt_and_tools(tmp_path: Path) -> None:
    tools = [complete_task_tool()]
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    full = {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}
    f = tmp_path / "sft.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [convo, {"messages": convo}, full]) + "\n")
    items = demonstrations(f, [], tools)
    for item in items[:2]:
        assert item["messages"][0] == {"role": "system", "content": SYSTEM}
        assert item["messages"][1:] == convo
        assert [t["function"]["name"] for t in item["tools"]] == ["complete_task"]
    assert items[2] is not full and items[2] == full  # a full item is used as it is
    f.write_text("{not json\n")
    with pytest.raises(UsageError, match=r"sft.jsonl:1: not a valid SFTConversation \(each line"):
        demonstrations(f, [], tools)


def test_bundled_scenarios_are_current_and_score_as_documented() -> None:
    on_disk = load_scenarios(ROOT / "examples/mcp_server/scenarios.jsonl")
    assert [s.model_dump() for s in on_disk] == [s.model_dump() for s in tasks.build()]
    assert len({s.task for s in on_disk}) == len(on_disk)
    s = next(x for x in on_disk if x.metadata["tool"] == "currency")

    def traj(answer: str, *calls: tuple[str, dict, str | None]) -> art.Trajectory:
        t = art.Trajectory(metadata={"answer": answer})
        t.tool_events = [
            art.ToolEvent(name=n, args=a, error=e, result=None if e else s.answer)
            for n, a, e in calls
        ]
        return t

    right = ("currency", s.metadata["args"], None)
    assert tasks.score(traj(f"It is the {s.answer}.", right), s) == 1.0
    assert tasks.score(traj("no idea", right), s) == 0.5
    assert tasks.score(traj("", ("currency", {"country": "Mars"}, "unknown")), s) == 0.25
    assert tasks.score(traj("", ("capital", s.metadata["args"], None)), s) == 0.0
    assert tasks.score(traj(s.answer + "s"), s) == 0.0  # a whole word, not a prefix


def test_reward_spec_errors_are_clear() -> None:
    with pytest.raises(UsageError, match="module:function"):
        load_reward("no_colon")
    with pytest.raises(UsageError, match="not a function"):
        load_reward("examples.mcp_server.tasks:HERE")
    assert load_reward("examples.mcp_server.tasks:score") is tasks.score


def test_eval_sample_is_a_fixed_subset_in_order() -> None:
    scen = load_scenarios(ROOT / "examples/mcp_server/scenarios.jsonl")
    assert eval_sample(scen, None, 0) == scen and eval_sample(scen, len(scen) + 5, 0) == scen
    some = eval_sample(scen, 5, 0)
    assert len(some) == 5 and some == eval_sample(scen, 5, 0)  # the same in every process
    assert [scen.index(s) for s in some] == sorted(scen.index(s) for s in some)
    assert eval_sample(scen, 5, 1) != some  # the seed draws it


@pytest.mark.parametrize("package", ["examples.mcp_server", "examples.mcp_books"])
def test_bundled_tasks_hold_out_entities_and_phrasings(package: str) -> None:
    """No held-out entity is ever trained on, in any wording; a held-out phrasing is never
    trained on either, and the held-out scenarios say which of them ask in one."""
    import importlib

    task = importlib.import_module(f"{package}.tasks")
    folder = package.replace(".", "/")
    on_disk = load_scenarios(ROOT / folder / "scenarios.jsonl")
    assert [s.model_dump() for s in on_disk] == [s.model_dump() for s in task.build()]
    train = [s for s in on_disk if s.split == "train"]
    val = [s for s in on_disk if s.split == "val"]
    assert (len(train), len(val)) == (128, 96)

    def entity(s: Scenario) -> str:
        return str(next(iter(s.metadata["args"].values())))

    def phrasing(s: Scenario) -> int:
        return int(s.id.rsplit("-", 1)[1])

    assert not {entity(s) for s in train} & {entity(s) for s in val}
    assert {s.metadata["entity"] for s in val} == {entity(s) for s in val}
    assert not {phrasing(s) for s in train} & set(task.HELD_OUT_PHRASINGS)
    for s in val:
        unseen = phrasing(s) in task.HELD_OUT_PHRASINGS
        assert s.metadata["slice"] == ("wording unseen" if unseen else "wording seen")
    assert {s.task for s in train}.isdisjoint(s.task for s in val)


@pytest.mark.parametrize("package", ["examples.mcp_server", "examples.mcp_books"])
def test_bundled_rewards_pay_only_an_answer_a_lookup_returned(package: str) -> None:
    """A right answer is a success only when a lookup of the episode returned it; one
    naming another candidate is not; the lookup alone keeps its partial credit."""
    import importlib

    task = importlib.import_module(f"{package}.tasks")
    s = next(x for x in task.build() if x.split == "val")
    tool, args = s.metadata["tool"], s.metadata["args"]
    other = next(c for c in task.candidates(s) if c.lower() != str(s.answer).lower())
    lookup = art.ToolEvent(name=tool, args=args, result=f"{s.answer}")

    def traj(answer: str, events: list[art.ToolEvent]) -> art.Trajectory:
        return art.Trajectory(metadata={"answer": answer}, tool_events=events)

    assert task.score(traj(f"It is {s.answer}.", [lookup]), s) == 1.0
    knew = traj(f"It is {s.answer}.", [])
    assert task.score(knew, s) == 0.0 and knew.metrics["right_without_lookup"]
    assert task.score(traj(f"{s.answer} or {other}", [lookup]), s) == 0.5
    assert task.score(traj("no idea", [lookup]), s) == 0.5
