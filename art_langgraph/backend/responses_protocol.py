"""Deprecated: `art_langgraph.backend.responses_protocol` (the Responses wire types) moved to `art_langgraph.serving.responses_protocol`; goes in 0.2.

Importing this module warns (DeprecationWarning) and gives the same objects; any other
name of the new module (a private helper, say) resolves through `__getattr__`.
Left out: anything new; import from the new path.
"""

import importlib
import warnings
from typing import Any

from art_langgraph.serving.responses_protocol import (
    FunctionCallItem,
    NamedFunctionChoice,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponsesTool,
    ResponseUsage,
    as_chat_completion,
    chat_body,
    chat_messages,
    chat_tool_choice,
    chat_tools,
    unsupported,
)

__all__ = [
    "FunctionCallItem",
    "NamedFunctionChoice",
    "OutputMessage",
    "OutputText",
    "ResponseObject",
    "ResponseUsage",
    "ResponsesRequest",
    "ResponsesTool",
    "as_chat_completion",
    "chat_body",
    "chat_messages",
    "chat_tool_choice",
    "chat_tools",
    "unsupported",
]

warnings.warn(
    "art_langgraph.backend.responses_protocol moved to art_langgraph.serving.responses_protocol; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("art_langgraph.serving.responses_protocol"), name)
