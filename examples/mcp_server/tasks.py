"""Scenarios, demonstrations and the programmatic reward for the bundled MCP server.

    python -m examples.mcp_server.tasks          # rewrite scenarios.jsonl beside this file

Each scenario asks for one tool (add, multiply or capital) and carries the expected
answer and a worked demonstration (tool call, result, complete_task), which the
harness uses for its SFT warm start. `score(trajectory, scenario)` is the reward:
1.0 when the final answer holds the expected one, 0.5 when the right tool was called
with the right arguments, 0.25 when the right tool was called at all, else 0.0 (the
partial credit gives a small model's early, half-formed calls a gradient).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import art_langgraph as art
from art_mcp.scenarios import Scenario, save_scenarios
from examples.mcp_server.server import CAPITALS

HERE = Path(__file__).resolve().parent


def _scenario(i: int, rng: random.Random) -> tuple[Scenario, str, dict]:
    kind = i % 3
    if kind == 0:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return (
            Scenario(
                id=f"add-{i:03d}", task=f"What is {a} plus {b}?", difficulty=1, answer=str(a + b)
            ),
            "add",
            {"a": a, "b": b},
        )
    if kind == 1:
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        return (
            Scenario(
                id=f"mul-{i:03d}", task=f"What is {a} times {b}?", difficulty=2, answer=str(a * b)
            ),
            "multiply",
            {"a": a, "b": b},
        )
    country = rng.choice(sorted(CAPITALS))
    name = country.title()
    return (
        Scenario(
            id=f"cap-{i:03d}",
            task=f"What is the capital of {name}?",
            difficulty=1,
            answer=CAPITALS[country],
        ),
        "capital",
        {"country": name},
    )


def build(n: int = 60, seed: int = 0) -> list[Scenario]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s, tool, args = _scenario(i, rng)
        call = {
            "id": f"call_{i}a",
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps(args)},
        }
        done = {
            "id": f"call_{i}b",
            "type": "function",
            "function": {"name": "complete_task", "arguments": json.dumps({"answer": s.answer})},
        }
        s.demonstration = [
            {"role": "user", "content": s.task},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": s.answer},
            {"role": "assistant", "content": "", "tool_calls": [done]},
        ]
        s.metadata = {"tool": tool, "args": args}
        out.append(s)
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
