"""Reward functions for trajectory groups: RULER, an LLM judge that scores a group relatively.

`ruler` scores conversations, `ruler_score_group` rescores a `TrajectoryGroup` (and works
as `after_each` of `gather_trajectory_groups`; with `nodes=`, it also judges chosen LangGraph
nodes on their own, into `node_rewards`). litellm is needed at call time only.
"""

from art_langgraph.rewards.ruler import (
    DEFAULT_RUBRIC,
    RulerScore,
    build_judge_messages,
    node_conversation,
    parse_judge_reply,
    ruler,
    ruler_score_group,
)

__all__ = [
    "DEFAULT_RUBRIC",
    "RulerScore",
    "build_judge_messages",
    "node_conversation",
    "parse_judge_reply",
    "ruler",
    "ruler_score_group",
]
