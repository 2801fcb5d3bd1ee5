"""Scenarios and the reward of the two-hop task (`examples.mcp_org.server`).

    python -m examples.mcp_org.tasks    # rewrite scenarios.jsonl beside this file

Two kinds of question about the fictional company, mixed, so the agent must decide how
many lookups a question needs:

- **two-hop**: a fact (extension, office or team) about someone's manager. It takes
  `lookup(person, "manager")`, then `lookup(<the manager it returned>, field)`, then the
  answer: the second call's argument comes from the first call's result.
- **one-hop**: a fact (extension, office, team or manager) about the person named.

Held-out scenarios (`split="val"`) name held-out people, whose managers are held-out
people too (the server's split), in phrasings training never uses: every entity and
every wording of a held-out question is new. Per person and fact: four train phrasings of
a two-hop question and two held-out ones; of a one-hop question, two of the staff
directory's four train phrasings (or of its four held-out ones), taken in turn. That is
30 x 3 x 4 = 360 two-hop and 30 x 4 x 2 = 240 one-hop train scenarios, and 20 x 3 x 2 =
120 two-hop and 20 x 4 x 2 = 160 one-hop held-out ones. No demonstrations: RL alone.

`score(trajectory, scenario)`: 1.0 when the answer is right *and* a lookup of the episode
returned it (`art_langgraph.rewards.check_answer`: an answer naming other candidates of
the field is not right, and a right answer no tool returned is not a success); else 0.1
for each lookup the question needs that the episode made (person and field). It records
`right_without_lookup` and `hops` among the trajectory's metrics.
"""

from __future__ import annotations

from pathlib import Path

import art_langgraph as art
from art_langgraph.rewards import check_answer, mentions
from art_mcp.scenarios import Scenario, save_scenarios
from examples.mcp_directory.tasks import N_TRAIN_PHRASINGS
from examples.mcp_directory.tasks import PHRASINGS as ONE_HOP
from examples.mcp_org.server import org

HERE = Path(__file__).resolve().parent
ONE_HOP_PHRASINGS = {
    **ONE_HOP,
    "manager": [
        "Who is the manager of {}?",
        "Who does {} report to?",
        "Name the manager of {}.",
        "Who manages {}?",
        "Which person is {}'s manager?",
        "Look up who manages {}.",
        "Tell me who {} reports to.",
        "Find the manager of {}.",
    ],
}
"""One-hop questions: the first four of each fact's phrasings are trained on, the rest held out."""
TWO_HOP_PHRASINGS = {
    "extension": [
        "What is the extension of {}'s manager?",
        "I need to call the manager of {}. Which extension?",
        "Give me the phone extension of the person {} reports to.",
        "Which extension does the manager of {} have?",
        "Find the extension of whoever manages {}.",
        "How do I phone {}'s manager? Give the extension.",
    ],
    "office": [
        "Which office is {}'s manager in?",
        "Where does the manager of {} sit? Give the room.",
        "What is the office room of the person {} reports to?",
        "Tell me the office of {}'s manager.",
        "In which room does the manager of {} work?",
        "Find the office of whoever manages {}.",
    ],
    "team": [
        "Which team is {}'s manager on?",
        "What team does the manager of {} work for?",
        "Name the team of the person {} reports to.",
        "Tell me the team of {}'s manager.",
        "Which team has the manager of {} in it?",
        "Find out what team the manager of {} is in.",
    ],
}
"""Two-hop questions: the first four of each fact's phrasings are trained on, the last two held out."""
N_TWO_HOP_TRAIN = 4
ONE_HOP_PER_FACT = 2
"""One-hop scenarios per person and fact (of the four phrasings of its split, in turn)."""


def build() -> list[Scenario]:
    """Every scenario of both kinds and splits, in a fixed order."""
    out = []
    for k, person in enumerate(org().values()):
        name, split = person["name"], person["split"]
        train = split == "train"
        manager = org()[person["manager"].lower()]
        for field, phrasings in TWO_HOP_PHRASINGS.items():
            chosen = phrasings[:N_TWO_HOP_TRAIN] if train else phrasings[N_TWO_HOP_TRAIN:]
            for p, phrasing in enumerate(chosen):
                lookups = [
                    {"person": name, "field": "manager"},
                    {"person": manager["name"], "field": field},
                ]
                out.append(
                    _scenario(f"2hop-{field}", name, p, phrasing, manager[field], split, lookups)
                )
        for f, (field, phrasings) in enumerate(ONE_HOP_PHRASINGS.items()):
            own = phrasings[:N_TRAIN_PHRASINGS] if train else phrasings[N_TRAIN_PHRASINGS:]
            for j in range(ONE_HOP_PER_FACT):
                p = (k + f + j) % len(own)
                lookups = [{"person": name, "field": field}]
                out.append(
                    _scenario(f"1hop-{field}", name, p, own[p], person[field], split, lookups)
                )
    return out


def _scenario(
    kind: str, name: str, p: int, phrasing: str, answer: str, split: str, lookups: list[dict]
) -> Scenario:
    return Scenario(
        id=f"{kind}-{name.lower().replace(' ', '-')}-{p}",
        task=phrasing.format(name),
        difficulty=len(lookups),
        answer=answer,
        split=split,  # type: ignore[arg-type]
        metadata={
            "hops": len(lookups),
            "field": lookups[-1]["field"],
            "lookups": lookups,
            "entity": name,  # phrasings of one person's questions: one cluster of errors
            "slice": "two-hop" if len(lookups) == 2 else "one-hop",  # reported apart
        },
    )


def candidates(scenario: Scenario) -> list[str]:
    """The values the asked field takes across the company, less any the question names
    (a manager's answer may repeat the person asked about)."""
    field = scenario.metadata["field"]
    values = {p["name" if field == "manager" else field] for p in org().values()}
    return sorted(v for v in values if not mentions(scenario.task, v))


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    """The reward (see the module doc)."""
    answer = str(traj.metadata.get("answer") or "")
    check = check_answer(answer, scenario.answer, traj, candidates(scenario))
    traj.metrics.update(
        right_without_lookup=check.right_without_lookup, hops=scenario.metadata["hops"]
    )
    if check.success:
        return 1.0
    made = [ev.args for ev in traj.tool_events if ev.name == "lookup" and ev.error is None]
    return 0.1 * sum(want in made for want in scenario.metadata["lookups"])


if __name__ == "__main__":
    save_scenarios(HERE / "scenarios.jsonl", build())
    print(f"wrote {HERE / 'scenarios.jsonl'}")
