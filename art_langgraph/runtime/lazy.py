"""Lazy package exports (PEP 562): a name is imported from its module on first use.

A client that only records trajectories and talks to a remote backend must not pay for
torch and transformers (8 s and 300 MB to import here); packages whose public names live
in torch-backed modules export them through `lazy_getattr`. Left out: anything else.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(
    package: str, namespace: dict[str, Any], names: dict[str, str]
) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `names[attr]` (a module path) on first access."""

    def __getattr__(attr: str) -> Any:
        module = names.get(attr)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(module), attr)
        namespace[attr] = value  # next time, a plain global
        return value

    return __getattr__
