"""Deprecated: moved into the `art_langgraph.integrations.langfuse` package; goes in 0.2.

The annotation queue is in `langfuse.annotation`, `calibrate` (and `CALIBRATION_FILE`) in
`langfuse.review`, the corrections as SFT examples in `langfuse.sft`. Importing this
module warns (DeprecationWarning) and gives the same objects.
Left out: anything new; import from the new paths.
"""

import warnings

from art_langgraph.integrations.langfuse.annotation import (
    REVIEW_FILE,
    ReviewPick,
    ReviewQueueClashError,
    ReviewReport,
    check_queue,
    ensure_queue,
    queue_id_for,
    resend_review_items,
    review_folder,
    review_sample,
    send_to_review,
)
from art_langgraph.integrations.langfuse.review import CALIBRATION_FILE, calibrate
from art_langgraph.integrations.langfuse.sft import correction_examples, corrections_sft_file

__all__ = [
    "CALIBRATION_FILE",
    "REVIEW_FILE",
    "ReviewPick",
    "ReviewQueueClashError",
    "ReviewReport",
    "calibrate",
    "check_queue",
    "correction_examples",
    "corrections_sft_file",
    "ensure_queue",
    "queue_id_for",
    "resend_review_items",
    "review_folder",
    "review_sample",
    "send_to_review",
]

warnings.warn(
    "art_langgraph.integrations.langfuse_review moved to art_langgraph.integrations.langfuse "
    "(annotation, review, sft); the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)
