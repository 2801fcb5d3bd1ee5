"""A reward for `art-mcp train` over the npm filesystem server (tests/mcp/test_isolation.py):
1.0 when the final answer names the file the scenario asks about, else 0.0."""

from __future__ import annotations

import art_langgraph as art
from art_mcp.agent import final_answer
from art_mcp.scenarios import Scenario


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    return float(str(scenario.answer).lower() in final_answer(traj).lower())
