"""Reward functions for trajectory groups: RULER, an LLM judge that scores a group relatively.

`ruler` scores conversations, `ruler_score_group` rescores a `TrajectoryGroup` (and works
as `after_each` of `gather_trajectory_groups`; with `nodes=`, it also judges chosen LangGraph
nodes on their own, into `node_rewards`). litellm is needed at call time only.
`check_answer` says whether a programmatic reward's expected answer was right *and* came
from a tool result of the episode (`rewards/grounded.py`).
"""

from art_langgraph.rewards.grounded import AnswerCheck, check_answer, mentions
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
    "AnswerCheck",
    "RulerScore",
    "build_judge_messages",
    "check_answer",
    "mentions",
    "node_conversation",
    "parse_judge_reply",
    "ruler",
    "ruler_score_group",
]
