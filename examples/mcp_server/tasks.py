"""Scenarios and the programmatic reward for the bundled MCP server.

    python -m examples.mcp_server.tasks    # rewrite scenarios.jsonl beside this file

A scenario is one question about one country, asked in one of twelve phrasings (six
for `capital`, six for `currency`). Solving one takes two tool calls: the lookup, then
`complete_task` with what it returned.

The split is by entity, with wording as a second axis: a third of the 24 countries
(`HELD_OUT_COUNTRIES`) are held out, and a held-out scenario (`split="val"`) asks about
one of them, in any of the twelve phrasings (96); `metadata["slice"]` says whether its
phrasing is one training never uses (`HELD_OUT_PHRASINGS`: two per tool, "wording unseen")
or not ("wording seen"), and the report gives each its own rise. A training scenario asks
about one of the other 16 countries in one of the other eight phrasings (128). A training
country in a held-out phrasing is in neither split. Each scenario carries its `split`,
the expected answer, the tool and arguments a good agent calls, its country
(`metadata["entity"]`: its held-out questions are one cluster of errors), and a worked
demonstration (tool call, result, complete_task) for the optional SFT warm start.

`score(trajectory, scenario)` is the reward: 1.0 when the final answer is right and a
lookup of the episode returned it (`art_langgraph.rewards.check_answer`: an answer that
also names another country's capital or currency is not right, and a right answer the
model knew without a lookup is not a success; it is counted as `right_without_lookup`);
else 0.5 when the right tool was called with the right arguments, 0.25 when the right
tool was called at all, else 0.0 (the partial credit gives a small model's early,
half-formed calls a gradient).

Why lookups and no arithmetic: the tiny preset (2 layers, random weights) cannot learn
to copy arbitrary numbers from a question into a call within minutes on a CPU; it can
learn which tool a phrasing asks for and which of the schema's countries it names.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import art_langgraph as art
from art_langgraph.rewards import check_answer
from art_mcp.scenarios import Scenario, save_scenarios
from examples.mcp_server.server import CAPITALS, CURRENCIES

HERE = Path(__file__).resolve().parent
PHRASINGS = [
    ("capital", "What is the capital of {}?"),
    ("capital", "Which city is the capital of {}?"),
    ("capital", "Name the capital of {}."),
    ("capital", "Tell me the capital city of {}."),
    ("capital", "{}: what is its capital?"),
    ("capital", "I need the capital of {}."),
    ("currency", "What currency does {} use?"),
    ("currency", "What is the currency of {}?"),
    ("currency", "Name the currency of {}."),
    ("currency", "Which money is used in {}?"),
    ("currency", "{}: what is its currency?"),
    ("currency", "I need the currency of {}."),
]


def _conversation(i: int, task: str, answer: str, tool: str, args: dict) -> list[dict[str, Any]]:
    call = {
        "id": f"call_{i}a",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps(args)},
    }
    done = {
        "id": f"call_{i}b",
        "type": "function",
        "function": {"name": "complete_task", "arguments": json.dumps({"answer": answer})},
    }
    return [
        {"role": "user", "content": task},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": answer},
        {"role": "assistant", "content": "", "tool_calls": [done]},
    ]


HELD_OUT_COUNTRIES = ("canada", "egypt", "ghana", "japan", "norway", "peru", "thailand", "vietnam")
"""Countries never trained on (a third of the 24, spread over the alphabet)."""
HELD_OUT_PHRASINGS = (2, 4, 8, 10)
"""Indexes into PHRASINGS never trained on: two per tool."""


def build(seed: int = 0) -> list[Scenario]:
    """Every held-out country in every phrasing and every training country in the training
    phrasings, each a scenario with its split and demonstration, shuffled."""
    pairs = [(c, p) for c in sorted(CAPITALS) for p in range(len(PHRASINGS))]
    random.Random(seed).shuffle(pairs)
    out = []
    for i, (country, p) in enumerate(pairs):
        held_out, unseen = country in HELD_OUT_COUNTRIES, p in HELD_OUT_PHRASINGS
        if unseen and not held_out:
            continue  # a training country in a held-out wording: in neither split
        tool, phrasing = PHRASINGS[p]
        name = country.title()
        task = phrasing.format(name)
        answer = (CAPITALS if tool == "capital" else CURRENCIES)[country]
        args = {"country": name}
        metadata: dict[str, Any] = {"tool": tool, "args": args, "entity": name}
        if held_out:
            metadata["slice"] = "wording unseen" if unseen else "wording seen"
        out.append(
            Scenario(
                id=f"{tool[:3]}-{country}-{p}",
                task=task,
                difficulty=1,
                answer=answer,
                demonstration=_conversation(i, task, answer, tool, args),
                split="val" if held_out else "train",
                metadata=metadata,
            )
        )
    return out


def candidates(scenario: Scenario) -> list[str]:
    """The values the asked tool returns across the countries."""
    return sorted(
        set((CAPITALS if scenario.metadata["tool"] == "capital" else CURRENCIES).values())
    )


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    """The demo's reward (see the module doc)."""
    answer = str(traj.metadata.get("answer") or "")
    check = check_answer(answer, scenario.answer or "", traj, candidates(scenario))
    traj.metrics["right_without_lookup"] = check.right_without_lookup
    if check.success:
        return 1.0
    want = scenario.metadata
    best = 0.0
    for ev in traj.tool_events:
        if ev.name == want.get("tool"):
            best = max(best, 0.5 if ev.error is None and ev.args == want.get("args") else 0.25)
    return best


if __name__ == "__main__":
    save_scenarios(HERE / "scenarios.jsonl", build())
    print(f"wrote {HERE / 'scenarios.jsonl'}")
