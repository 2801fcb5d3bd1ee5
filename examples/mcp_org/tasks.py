"""Scenarios and the reward of the two-hop task (`examples.mcp_org.server`).

    python -m examples.mcp_org.tasks    # rewrite scenarios.jsonl beside this file

Two kinds of question about the fictional company, mixed, so the agent must decide how
many lookups a question needs:

- **two-hop**: a fact (extension, office or team) about the person who leads a project.
  It takes `project_lead(project)`, then `lookup(<the lead it returned>, field)`, then the
  answer: the second call's argument comes from the first call's result.
- **one-hop**: who leads a project (`project_lead`), or a fact about a person named
  (`lookup`, in the staff directory's phrasings).

Held-out scenarios (`split="val"`) name held-out projects (whose leads are held-out
people) and held-out people, in phrasings training never uses: every entity and every
wording of a held-out question is new. 64 training scenarios carry a worked demonstration
(each call, its result, the answer): the default SFT warm start's (`N_DEMONSTRATIONS`),
all about every third training project, its lead and the people who lead none
(`taught_entities`), so RL practises on projects and leads no demonstration shows. Per
project and fact: four train phrasings of a two-hop question and two held-out ones; per project, two one-hop lead questions (of four
train or four held-out phrasings, in turn); per person and fact, two of the staff
directory's four train (or held-out) phrasings. That is 24 x 3 x 4 = 288 two-hop and
24 x 2 + 30 x 3 x 2 = 228 one-hop train scenarios, and 16 x 3 x 2 = 96 two-hop and
16 x 2 + 20 x 3 x 2 = 152 one-hop held-out ones.

`score(trajectory, scenario)`: 1.0 when the answer is right *and* a lookup of the episode
returned it (`art_langgraph.rewards.check_answer`: an answer naming other candidates of
the field is not right, and a right answer no tool returned is not a success); else 0.1
for each call the question needs (tool and arguments) that the episode made. It records
`right_without_lookup` and `hops` among the trajectory's metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import art_langgraph as art
from art_langgraph.rewards import check_answer
from art_mcp.scenarios import Scenario, save_scenarios
from examples.mcp_directory.tasks import N_TRAIN_PHRASINGS
from examples.mcp_directory.tasks import PHRASINGS as PERSON_PHRASINGS
from examples.mcp_org.server import fact_result, lead_result, org, projects

HERE = Path(__file__).resolve().parent
LEAD_PHRASINGS = [
    "Who leads project {}?",
    "Who is the lead of project {}?",
    "Name the lead of project {}.",
    "Which person leads project {}?",
    "Look up who leads project {}.",
    "Tell me who runs project {}.",
    "Find the lead of project {}.",
    "Project {}: who leads it?",
]
"""One-hop lead questions: the first four are trained on, the rest held out."""
TWO_HOP_PHRASINGS = {
    "extension": [
        "What is the extension of the person who leads project {}?",
        "I need to call the lead of project {}. Which extension?",
        "Give me the phone extension of project {}'s lead.",
        "Which extension does the lead of project {} have?",
        "Find the extension of whoever leads project {}.",
        "How do I phone the lead of project {}? Give the extension.",
    ],
    "office": [
        "Which office is the lead of project {} in?",
        "Where does the person who leads project {} sit? Give the room.",
        "What is the office room of project {}'s lead?",
        "Tell me the office of the lead of project {}.",
        "In which room does the lead of project {} work?",
        "Find the office of whoever leads project {}.",
    ],
    "team": [
        "Which team is the lead of project {} on?",
        "What team does the person who leads project {} work for?",
        "Name the team of project {}'s lead.",
        "Tell me the team of the lead of project {}.",
        "Which team has the lead of project {} in it?",
        "Find out what team the lead of project {} is in.",
    ],
}
"""Two-hop questions: the first four of each fact's phrasings are trained on, the last two held out."""
N_TWO_HOP_TRAIN = 4
ONE_HOP_PER_ENTITY = 2
"""One-hop scenarios per project, and per person and fact (of the four phrasings of its
split, in turn)."""
N_DEMONSTRATIONS = 64
"""Training scenarios that carry a demonstration, half one-hop and half two-hop, evenly
spread: the default SFT warm start's. With one epoch, 64 took the model's two-hop sampled
success on the validation slice from 0.00 to 0.28, as 128 did; with the default three,
to 0.57, one-hop to 0.58 (bench/results/warm_start), when they were spread over every
training project."""
TAUGHT_EVERY = 3
"""The demonstrations are about every third training project (`taught_entities`), so RL
practises on projects and leads the warm start never showed, as held-out questions name.
Spread over every project, the warm start left RL's training two-hop questions solved (0.75
and 0.96 of its first rollouts; 3 and 10 of 27-28 two-hop groups with a right and a wrong
rollout, bench/results/learning/d3519c3/kept_runs_groups.json) and held-out two-hop did not
rise; a run whose RL began at 0.35 there drew 17 of 30 and rose +0.47. A third was set once,
not swept: its one measurement is the 0cefb6b table (docs/results.md)."""


def _own(phrasings: list[str], n_train: int, train: bool) -> list[str]:
    return phrasings[:n_train] if train else phrasings[n_train:]


def build() -> list[Scenario]:
    """Every scenario of both kinds and splits, in a fixed order."""
    out = []
    for k, project in enumerate(projects().values()):
        name, split = project["name"], project["split"]
        train = split == "train"
        lead = org()[project["lead"].lower()]
        first = {"tool": "project_lead", "args": {"project": name}}
        for field, phrasings in TWO_HOP_PHRASINGS.items():
            for p, phrasing in enumerate(_own(phrasings, N_TWO_HOP_TRAIN, train)):
                second = {"tool": "lookup", "args": {"person": lead["name"], "field": field}}
                out.append(
                    _scenario(
                        f"2hop-{field}", name, p, phrasing, lead[field], split, [first, second]
                    )
                )
        own = _own(LEAD_PHRASINGS, N_TRAIN_PHRASINGS, train)
        for j in range(ONE_HOP_PER_ENTITY):
            p = (k + j) % len(own)
            out.append(_scenario("1hop-lead", name, p, own[p], lead["name"], split, [first]))
    for k, person in enumerate(org().values()):
        name, split = person["name"], person["split"]
        for f, (field, phrasings) in enumerate(PERSON_PHRASINGS.items()):
            own = _own(phrasings, N_TRAIN_PHRASINGS, split == "train")
            for j in range(ONE_HOP_PER_ENTITY):
                p = (k + f + j) % len(own)
                look = {"tool": "lookup", "args": {"person": name, "field": field}}
                out.append(
                    _scenario(f"1hop-{field}", name, p, own[p], person[field], split, [look])
                )
    keep = demonstration_ids(out, N_DEMONSTRATIONS)
    return [s if s.id in keep else s.model_copy(update={"demonstration": None}) for s in out]


def demonstration_ids(scenarios: list[Scenario], n: int) -> set[str]:
    """The ids of the `n` training scenarios that carry a demonstration: half of each
    slice (one-hop, two-hop), evenly spread in order (at most all of a slice), all of them
    about the entities `taught_entities` names."""
    taught = taught_entities(scenarios)
    keep: set[str] = set()
    for label in ("one-hop", "two-hop"):
        items = [
            s
            for s in scenarios
            if s.split == "train"
            and s.metadata["slice"] == label
            and s.metadata["entity"] in taught
        ]
        k = min(n // 2, len(items))
        keep |= {items[i * len(items) // k].id for i in range(k)}
    return keep


def taught_entities(scenarios: list[Scenario]) -> set[str]:
    """The training entities the demonstrations are about: every `TAUGHT_EVERY`th training
    project (in order), the people who lead them, and the people who lead no project. RL's
    other training questions name projects, and leads, that no demonstration shows."""
    train = [s for s in scenarios if s.split == "train"]
    led = {
        s.metadata["entity"]: projects()[s.metadata["entity"].lower()]["lead"]
        for s in train
        if s.metadata["calls"][0]["tool"] == "project_lead"
    }
    people = {s.metadata["entity"] for s in train if s.metadata["calls"][0]["tool"] == "lookup"}
    chosen = [p for i, p in enumerate(led) if i % TAUGHT_EVERY == 0]
    return {*chosen, *(led[p] for p in chosen), *(people - set(led.values()))}


def _result(call: dict[str, Any]) -> str:
    """What the server returns for `call` (one of a scenario's `calls`)."""
    args = call["args"]
    if call["tool"] == "project_lead":
        return lead_result(args["project"], projects()[args["project"].lower()]["lead"])
    person = org()[args["person"].lower()]
    return fact_result(person["name"], args["field"], person[args["field"]])


def demonstration(task: str, calls: list[dict[str, Any]], answer: str) -> list[dict[str, Any]]:
    """A worked conversation for the optional SFT warm start: each call the question needs,
    its result, then `complete_task` with the answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for i, call in enumerate([*calls, {"tool": "complete_task", "args": {"answer": answer}}]):
        tool_call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": call["tool"], "arguments": json.dumps(call["args"])},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        if call["tool"] != "complete_task":
            messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": _result(call)})
    return messages


def _scenario(
    kind: str, entity: str, p: int, phrasing: str, answer: str, split: str, calls: list[dict]
) -> Scenario:
    task = phrasing.format(entity)
    return Scenario(
        id=f"{kind}-{entity.lower().replace(' ', '-')}-{p}",
        task=task,
        difficulty=len(calls),
        answer=answer,
        demonstration=demonstration(task, calls, answer) if split == "train" else None,
        split=split,  # type: ignore[arg-type]
        metadata={
            "hops": len(calls),
            "field": calls[-1]["args"].get("field", "lead"),
            "calls": calls,
            "entity": entity,  # the phrasings of one entity's questions: one cluster of errors
            "kind": kind,
            "phrasing": phrasing,  # validation_scenarios holds wordings out, as the split does
            "slice": "two-hop" if len(calls) == 2 else "one-hop",  # reported apart
        },
    )


def candidates(scenario: Scenario) -> list[str]:
    """The values the asked field takes across the company (every person's name, for a
    lead)."""
    field = scenario.metadata["field"]
    return sorted({p["name" if field == "lead" else field] for p in org().values()})


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    """The reward (see the module doc)."""
    answer = str(traj.metadata.get("answer") or "")
    check = check_answer(answer, scenario.answer or "", traj, candidates(scenario))
    traj.metrics.update(
        right_without_lookup=check.right_without_lookup, hops=scenario.metadata["hops"]
    )
    if check.success:
        return 1.0
    made = [{"tool": ev.name, "args": ev.args} for ev in traj.tool_events if ev.error is None]
    return 0.1 * sum(want in made for want in scenario.metadata["calls"])


if __name__ == "__main__":
    save_scenarios(HERE / "scenarios.jsonl", build())
    print(f"wrote {HERE / 'scenarios.jsonl'}")
