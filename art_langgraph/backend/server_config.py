"""Deprecated: `art_langgraph.backend.server_config` (the server's limits) moved to `art_langgraph.serving.config`; goes in 0.2.

Importing this module warns (DeprecationWarning) and gives the same objects; any other
name of the new module (a private helper, say) resolves through `__getattr__`.
Left out: anything new; import from the new path.
"""

import importlib
import warnings
from typing import Any

from art_langgraph.serving.config import (
    ServerConfig,
)

__all__ = [
    "ServerConfig",
]

warnings.warn(
    "art_langgraph.backend.server_config moved to art_langgraph.serving.config; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("art_langgraph.serving.config"), name)
