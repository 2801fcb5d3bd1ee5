"""Deprecated: `art_langgraph.backend.server` (the OpenAI-compatible server's routes) moved to `art_langgraph.serving.app`; goes in 0.2.

Importing this module warns (DeprecationWarning) and gives the same objects; any other
name of the new module (a private helper, say) resolves through `__getattr__`.
Left out: anything new; import from the new path.
"""

import importlib
import warnings
from typing import Any

from art_langgraph.serving.app import (
    create_app,
)

__all__ = [
    "create_app",
]

warnings.warn(
    "art_langgraph.backend.server moved to art_langgraph.serving.app; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("art_langgraph.serving.app"), name)
