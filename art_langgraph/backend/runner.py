"""Deprecated: `art_langgraph.backend.runner` (starting the server) moved to `art_langgraph.serving.runner`; goes in 0.2.

Importing this module warns (DeprecationWarning) and gives the same objects; any other
name of the new module (a private helper, say) resolves through `__getattr__`.
Left out: anything new; import from the new path.
"""

import importlib
import warnings
from typing import Any

from art_langgraph.serving.runner import (
    ServerHandle,
    check_bind,
    serve,
    start_app_server,
    start_server,
)

__all__ = [
    "ServerHandle",
    "check_bind",
    "serve",
    "start_app_server",
    "start_server",
]

warnings.warn(
    "art_langgraph.backend.runner moved to art_langgraph.serving.runner; the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("art_langgraph.serving.runner"), name)
