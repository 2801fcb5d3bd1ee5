"""A reward for `art-mcp train` runs of the tiny preset that must train
(tests/mcp/test_harness_faults.py): 0 and 1 in turn per scenario, so each group's two
rollouts differ. The tiny model's rollouts may be identical and the task's own reward
gives them all 0; a step would then train on nothing, and an adapter no step changed is
not evaluated again, where these tests need an evaluation after each step."""

from __future__ import annotations

import collections

import art_langgraph as art
from art_mcp.scenarios import Scenario

_seen: collections.Counter[str] = collections.Counter()


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    _seen[scenario.id] += 1
    return float(_seen[scenario.id] % 2)
