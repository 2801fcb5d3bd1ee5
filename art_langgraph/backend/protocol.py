"""Deprecated: `art_langgraph.backend.protocol` (the chat-completions wire types) moved to `art_langgraph.serving.chat_protocol`; goes in 0.2.

Importing this module warns (DeprecationWarning) and gives the same objects; any other
name of the new module (a private helper, say) resolves through `__getattr__`.
Left out: anything new; import from the new path.
"""

import importlib
import warnings
from typing import Any

from art_langgraph.serving.chat_protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    NamedToolChoice,
    PromptTokensDetails,
    ResponseMessage,
    TokenLogprob,
    Tool,
    TopLogprob,
    Usage,
)

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "Choice",
    "ChoiceLogprobs",
    "ChunkChoice",
    "Delta",
    "NamedToolChoice",
    "PromptTokensDetails",
    "ResponseMessage",
    "TokenLogprob",
    "Tool",
    "TopLogprob",
    "Usage",
]

warnings.warn(
    "art_langgraph.backend.protocol moved to art_langgraph.serving.chat_protocol; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("art_langgraph.serving.chat_protocol"), name)
