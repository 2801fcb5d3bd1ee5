"""Scenarios and the programmatic reward for the bundled MCP server.

    python -m examples.mcp_server.tasks    # rewrite scenarios.jsonl beside this file

A scenario is one question about one country, asked in one of twelve phrasings (six
for `capital`, six for `currency`): every (country, phrasing) pair. Solving one takes two
tool calls: the lookup, then `complete_task` with what it returned.

The split is by entity or by phrasing, so no held-out question is ever trained on: a
quarter of the 24 countries (`HELD_OUT_COUNTRIES`) and two phrasings of each tool
(`HELD_OUT_PHRASINGS`) never appear in training. Train: the other 18 countries in the
other 8 phrasings (144 scenarios); held out: every pair with a held-out country or
phrasing (144), so half of the held-out questions (72) ask about a training country, with
the same tool and answer, in a held-out wording. Each scenario carries its `split`, the expected
answer, the tool and arguments a good agent calls, and a worked demonstration (tool
call, result, complete_task) for the optional SFT warm start, taken from the train
split only.

`score(trajectory, scenario)` is the reward: 1.0 when the final answer holds the
expected one, 0.5 when the right tool was called with the right arguments, 0.25 when
the right tool was called at all, else 0.0 (the partial credit gives a small model's
early, half-formed calls a gradient).

Why lookups and no arithmetic: the tiny preset (2 layers, random weights) cannot learn
to copy arbitrary numbers from a question into a call within minutes on a CPU; it can
learn which tool a phrasing asks for and which of the schema's countries it names.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import art_langgraph as art
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


HELD_OUT_COUNTRIES = ("canada", "egypt", "japan", "norway", "thailand", "vietnam")
"""Countries never trained on (a quarter of the 24, spread over the alphabet)."""
HELD_OUT_PHRASINGS = (2, 4, 8, 10)
"""Indexes into PHRASINGS never trained on: two per tool."""


def build(seed: int = 0) -> list[Scenario]:
    """Every (country, phrasing) pair as a scenario with its split and demonstration,
    shuffled."""
    pairs = [(c, p) for c in sorted(CAPITALS) for p in range(len(PHRASINGS))]
    random.Random(seed).shuffle(pairs)
    out = []
    for i, (country, p) in enumerate(pairs):
        tool, phrasing = PHRASINGS[p]
        name = country.title()
        task = phrasing.format(name)
        answer = (CAPITALS if tool == "capital" else CURRENCIES)[country]
        args = {"country": name}
        held_out = country in HELD_OUT_COUNTRIES or p in HELD_OUT_PHRASINGS
        out.append(
            Scenario(
                id=f"{tool[:3]}-{country}-{p}",
                task=task,
                difficulty=1,
                answer=answer,
                demonstration=_conversation(i, task, answer, tool, args),
                split="val" if held_out else "train",
                metadata={"tool": tool, "args": args},
            )
        )
    return out


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    """The demo's reward (see the module doc)."""
    answer = str(traj.metadata.get("answer") or "")
    if scenario.answer and re.search(
        rf"(?<![\w]){re.escape(scenario.answer)}(?![\w])", answer, re.IGNORECASE
    ):
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
