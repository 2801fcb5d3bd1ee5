"""Deprecated: `art_langgraph.backend.guard` (the server's outer ASGI layer) moved to `art_langgraph.serving.guard`; goes in 0.2.

Importing this module warns (DeprecationWarning) and gives the same objects; any other
name of the new module (a private helper, say) resolves through `__getattr__`.
Left out: anything new; import from the new path.
"""

import importlib
import warnings
from typing import Any

from art_langgraph.serving.guard import (
    Guard,
    error_json,
)

__all__ = [
    "Guard",
    "error_json",
]

warnings.warn(
    "art_langgraph.backend.guard moved to art_langgraph.serving.guard; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("art_langgraph.serving.guard"), name)
