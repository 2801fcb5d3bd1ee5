"""Deprecated: moved to `art_langgraph.integrations.langfuse.datasets`; this path goes in 0.2.

Importing it warns (DeprecationWarning) and gives the same objects as the new module.
Left out: anything new; import from the new path.
"""

import warnings

from art_langgraph.integrations.langfuse.datasets import (
    DATASET_MARKER,
    EVALUATIONS_FILE,
    DatasetClashError,
    EvaluationLog,
    EvaluationRun,
    item_id,
    last_run_id,
    log_evaluation,
    resend_evaluations,
    send_evaluation,
)

__all__ = [
    "DATASET_MARKER",
    "EVALUATIONS_FILE",
    "DatasetClashError",
    "EvaluationLog",
    "EvaluationRun",
    "item_id",
    "last_run_id",
    "log_evaluation",
    "resend_evaluations",
    "send_evaluation",
]

warnings.warn(
    "art_langgraph.integrations.langfuse_datasets moved to "
    "art_langgraph.integrations.langfuse.datasets; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)
