"""`repeat_penalty`: a solved training rollout's reward loses the penalty per repeated tool
call, once, its score kept as `task_reward`, which still counts success in the reports; a
failed one keeps its reward."""

from __future__ import annotations

import art_langgraph as art
from art_mcp import HarnessConfig, Scenario
from art_mcp.check import summarize
from art_mcp.evaluation import episode_calls
from art_mcp.scoring import penalize_repeats, repeated_calls, task_reward


def _episode(*countries: str, reward: float) -> art.Trajectory:
    t = art.Trajectory(reward=reward, metadata={"scenario": "s0"})
    for country in countries:
        t.add_tool_event(art.ToolEvent(name="capital", args={"country": country}))
    t.add_tool_event(art.ToolEvent(name="complete_task", args={"answer": "Hanoi"}))
    t.add_tool_event(art.ToolEvent(name="complete_task", args={"answer": "Hanoi"}))
    return t


def test_each_repeated_call_costs_the_penalty_once() -> None:
    twice = _episode("Vietnam", "Vietnam", "Peru", "Vietnam", reward=1.0)
    clean = _episode("Vietnam", "Peru", reward=1.0)
    failed = _episode("Peru", "Peru", reward=0.0)
    groups = [art.TrajectoryGroup([twice, clean, failed])]
    # complete_task is never a repeat; the same name with other arguments is not either
    assert [repeated_calls(t) for t in (twice, clean, failed)] == [2, 0, 1]
    penalize_repeats(groups, 0.1, 1.0)
    penalize_repeats(groups, 0.1, 1.0)  # a second pass takes nothing more
    # the failed rollout keeps its 0: a penalty among failures would reward giving up
    assert [round(t.reward, 6) for t in (twice, clean, failed)] == [0.8, 1.0, 0.0]
    assert [task_reward(t) for t in (twice, clean, failed)] == [1.0, 1.0, 0.0]
    assert episode_calls(twice, 1.0).solved and episode_calls(twice, 1.0).repeated == 2


def test_no_penalty_leaves_the_rewards_alone() -> None:
    t = _episode("Vietnam", "Vietnam", reward=1.0)
    penalize_repeats([art.TrajectoryGroup([t])], 0.0, 1.0)
    assert t.reward == 1.0 and "task_reward" not in t.metadata


def test_the_summary_counts_success_by_the_task_reward() -> None:
    """A group whose rollouts all solved the task, one with a repeat: the penalty gives
    GRPO a spread to learn from, and the success rate stays the task's."""
    cfg = HarnessConfig(base_model="tiny", group_size=2, repeat_penalty=0.1)
    runs = [_episode("Vietnam", "Vietnam", reward=1.0), _episode("Vietnam", reward=1.0)]
    groups = [art.TrajectoryGroup(runs)]
    flat = summarize(groups, [Scenario(id="s0", task="t")], cfg)
    assert flat.flat_groups == 1.0  # before the penalty: one reward for both
    penalize_repeats(groups, cfg.repeat_penalty, cfg.success_reward)
    p = summarize(groups, [Scenario(id="s0", task="t")], cfg)
    assert p.sampled_success == 1.0 and p.flat_groups == 0.0
