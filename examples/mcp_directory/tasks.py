"""Scenarios and the reward for the staff directory (`examples.mcp_directory.server`).

    python -m examples.mcp_directory.tasks    # rewrite scenarios.jsonl beside this file

A scenario asks for one fact (extension, office or team) about one person, in one of
eight phrasings per fact. The generator holds out both entities and phrasings: a
held-out scenario (`split="val"`) names a person whose first and last names never occur
in training, in one of the four phrasings per fact that training never uses. That gives
16 people x 3 facts x 4 phrasings = 192 held-out scenarios and 24 x 3 x 4 = 288 train ones.
A solved episode takes two tool calls: the lookup, then `complete_task` with its result.

No demonstrations: the real model is trained by RL alone.

`score(trajectory, scenario)`: 1.0 when the final answer is right *and* a lookup of the
episode returned it (`art_langgraph.rewards.check_answer`: an answer naming other values
of the field is not right); else 0.2 when the right lookup was made (person and field) (a
small model's half-way episodes keep a gradient); else 0.0. It records
`right_without_lookup` among the trajectory's metrics.
"""

from __future__ import annotations

from pathlib import Path

import art_langgraph as art
from art_langgraph.rewards import check_answer
from art_mcp.scenarios import Scenario, save_scenarios
from examples.mcp_directory.server import directory

HERE = Path(__file__).resolve().parent
# Per fact: four train phrasings, then two held-out ones.
PHRASINGS = {
    "extension": [
        "Look up the extension of {}.",
        "What number do I dial for {}?",
        "What is {}'s phone extension?",
        "Give me the extension of {}.",
        "Which extension does {} have?",
        "I need to call {}. What is the extension?",
        "How do I reach {} by phone? Give the extension.",
        "Find the phone extension for {}.",
    ],
    "office": [
        "Which office is {} in?",
        "What is the office room of {}?",
        "Where does {} sit? Give the room.",
        "Tell me the office of {}.",
        "Find the office room of {}.",
        "Where is the office of {}?",
        "In which room does {} work?",
        "Look up the office of {}.",
    ],
    "team": [
        "Which team is {} on?",
        "What team does {} work for?",
        "Name the team of {}.",
        "{} belongs to which team?",
        "Which team has {} in it?",
        "What is the team of {}?",
        "Find out what team {} is in.",
        "Tell me the team of {}.",
    ],
}
N_TRAIN_PHRASINGS = 4


def build() -> list[Scenario]:
    """Every (person, fact, phrasing) scenario of its split, in a fixed order."""
    out = []
    for person in directory().values():
        split = person["split"]
        for field, phrasings in PHRASINGS.items():
            chosen = (
                phrasings[:N_TRAIN_PHRASINGS] if split == "train" else phrasings[N_TRAIN_PHRASINGS:]
            )
            for p, phrasing in enumerate(chosen):
                name = person["name"]
                task = phrasing.format(name)
                out.append(
                    Scenario(
                        id=f"{field}-{name.lower().replace(' ', '-')}-{p}",
                        task=task,
                        difficulty=1,
                        answer=person[field],
                        split=split,  # type: ignore[arg-type]
                        metadata={
                            "tool": "lookup",
                            "args": {"person": name, "field": field},
                            "entity": name,  # errors clustered by person
                        },
                    )
                )
    return out


def candidates(scenario: Scenario) -> list[str]:
    """The values the asked field takes across the directory."""
    field = scenario.metadata["args"]["field"]
    return sorted({p[field] for p in directory().values()})


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    """The reward (see the module doc)."""
    answer = str(traj.metadata.get("answer") or "")
    check = check_answer(answer, scenario.answer or "", traj, candidates(scenario))
    traj.metrics["right_without_lookup"] = check.right_without_lookup
    if check.success:
        return 1.0
    want = scenario.metadata
    for ev in traj.tool_events:
        if ev.name == want["tool"] and ev.error is None and ev.args == want["args"]:
            return 0.2
    return 0.0


if __name__ == "__main__":
    save_scenarios(HERE / "scenarios.jsonl", build())
    print(f"wrote {HERE / 'scenarios.jsonl'}")
