"""How this integration calls the Langfuse SDK's API client (`langfuse.api.LangfuseAPI`).

`NO_RETRY` goes in every request's `request_options`: the SDK would retry a failed request
twice with backoff, and every caller here is fail-soft already (what did not get through
is recorded and re-sent by `art-langgraph langfuse export`), so a retry would only hold up
training. `pages` walks a paged list endpoint (`page`, `meta.total_pages`).

Left out: the plain JSON requests the SDK's client lacks (datasets.py) and the OTLP span
export (sender.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

NO_RETRY: Any = {"max_retries": 0}
"""`request_options` for one try only."""


def pages(list_page: Callable[[int], Any]) -> Iterator[Any]:
    """Every row of a paged list: `list_page(page)` returns one page (1-based), with `data`
    and `meta.total_pages`; stops after the last page or an empty one."""
    page = 1
    while True:
        res = list_page(page)
        yield from res.data
        if page >= (getattr(res.meta, "total_pages", 1) or 1) or not res.data:
            return
        page += 1
