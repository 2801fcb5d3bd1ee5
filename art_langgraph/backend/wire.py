"""Deprecated: `art_langgraph.backend.wire` (the training API's wire format) moved to `art_langgraph.backend.api.wire`; goes in 0.2.

Importing this module warns (DeprecationWarning) and gives the same objects; any other
name of the new module (a private helper, say) resolves through `__getattr__`.
Left out: anything new; import from the new path.
"""

import importlib
import warnings
from typing import Any

from art_langgraph.backend.api.wire import (
    IDEMPOTENCY_HEADER,
    DeleteRequest,
    EvaluationRequest,
    LogRequest,
    ModelSpec,
    SFTItem,
    SFTRequest,
    StepEvent,
    TrainRequest,
    check_idempotency_key,
    decode_body,
    encode_body,
    idempotency_key,
)

__all__ = [
    "IDEMPOTENCY_HEADER",
    "DeleteRequest",
    "EvaluationRequest",
    "LogRequest",
    "ModelSpec",
    "SFTItem",
    "SFTRequest",
    "StepEvent",
    "TrainRequest",
    "check_idempotency_key",
    "decode_body",
    "encode_body",
    "idempotency_key",
]

warnings.warn(
    "art_langgraph.backend.wire moved to art_langgraph.backend.api.wire; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("art_langgraph.backend.api.wire"), name)
