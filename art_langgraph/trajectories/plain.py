"""Plain JSON data from whatever a caller hands over: SDK response objects (openai's,
pydantic models, duck-typed `model_dump()`s), tuples, numpy scalars.

`plain(value)` copies containers, dumps models (JSON mode), turns tuples into lists and
numeric scalars into ints and floats, and anything else into its `str()`; `drop_none`
also drops the keys whose value is None (a chat message's unset fields).
`plain_response` is `plain` for a whole API response, without walking a pydantic dump
again. Trajectories, capture and the training API's progress events all read caller data
through these.

Left out: validation (the typed records do that) and writing files (`records.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any


def dump_model(obj: Any, *, exclude_unset: bool = False) -> Any:
    """A pydantic (or pydantic-like) object as plain data."""
    try:
        return obj.model_dump(mode="json", exclude_unset=exclude_unset)
    except TypeError:  # a duck-typed model_dump without those keywords
        return obj.model_dump()


def plain(value: Any, *, drop_none: bool = False) -> Any:
    """Plain JSON data from `value`: containers copied, models dumped, anything else `str()`."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {
            str(k): plain(v, drop_none=drop_none)
            for k, v in value.items()
            if not (drop_none and v is None)
        }
    if isinstance(value, list | tuple):
        return [plain(v, drop_none=drop_none) for v in value]
    if hasattr(value, "model_dump"):
        return plain(dump_model(value), drop_none=drop_none)
    if isinstance(value, Integral | Real):  # numpy scalars and the like
        return int(value) if isinstance(value, Integral) else float(value)
    return str(value)


def plain_response(response: Any) -> Any:
    """An API response as plain JSON data. A pydantic model's JSON-mode dump is that
    already, so it is not walked again (a completion's logprobs make that walk the costly
    part)."""
    if hasattr(response, "model_dump"):
        try:
            return response.model_dump(mode="json", exclude_unset=True)
        except TypeError:  # a duck-typed model_dump without those keywords
            return plain(response.model_dump())
    return plain(response)
