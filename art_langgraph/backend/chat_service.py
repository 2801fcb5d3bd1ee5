"""Deprecated: `art_langgraph.backend.chat_service` (the chat-completions translation) moved to `art_langgraph.serving.chat_service`; goes in 0.2.

Importing this module warns (DeprecationWarning) and gives the same objects; any other
name of the new module (a private helper, say) resolves through `__getattr__`.
Left out: anything new; import from the new path.
"""

import importlib
import warnings
from typing import Any

from art_langgraph.serving.chat_service import (
    ChatService,
    Plan,
    ServiceError,
    parse_json_body,
    validation_message,
)

__all__ = [
    "ChatService",
    "Plan",
    "ServiceError",
    "parse_json_body",
    "validation_message",
]

warnings.warn(
    "art_langgraph.backend.chat_service moved to art_langgraph.serving.chat_service; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("art_langgraph.serving.chat_service"), name)
