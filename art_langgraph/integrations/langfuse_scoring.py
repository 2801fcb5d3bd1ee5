"""Deprecated: moved to `art_langgraph.integrations.langfuse.scoring`; this path goes in 0.2.

Importing it warns (DeprecationWarning) and gives the same objects as the new module.
Left out: anything new; import from the new path.
"""

import warnings

from art_langgraph.integrations.langfuse.scoring import (
    INDEPENDENT_REWARD,
    REVIEW_DECISION,
    REVIEW_SCORE,
    REWARD,
    RULER_SCORE,
    SCORE_CONFIGS,
    SUCCESS,
    SUCCESS_RATE,
    ScoreConfigClashError,
    ScoreConfigSpec,
    ensure_score_configs,
)

__all__ = [
    "INDEPENDENT_REWARD",
    "REVIEW_DECISION",
    "REVIEW_SCORE",
    "REWARD",
    "RULER_SCORE",
    "SCORE_CONFIGS",
    "SUCCESS",
    "SUCCESS_RATE",
    "ScoreConfigClashError",
    "ScoreConfigSpec",
    "ensure_score_configs",
]

warnings.warn(
    "art_langgraph.integrations.langfuse_scoring moved to "
    "art_langgraph.integrations.langfuse.scoring; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)
