"""`PerLoop`: one value per running asyncio event loop, forgotten when its loop closes.

asyncio objects (semaphores, connection pools) belong to the loop that made them; code
that may run under several loops (a test suite, a server thread beside the user's loop,
`asyncio.run` called twice) keeps one per loop. A closed loop's entry is dropped on the
next lookup from a new loop (through `dispose`, when given), never kept alive. Left
out: thread-local values.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """`get()` returns the running loop's value, made by `factory` on first use."""

    def __init__(
        self, factory: Callable[[], T], dispose: Callable[[T], None] | None = None
    ) -> None:
        """`factory` runs inside the new loop; `dispose` gets a closed loop's value as it is
        dropped (it must not need the loop)."""
        self._factory = factory
        self._dispose = dispose
        self._values: dict[asyncio.AbstractEventLoop, T] = {}
        self._lock = threading.Lock()

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        value = self._values.get(loop)  # the common case: one dict lookup, no lock
        if value is not None:
            return value
        with self._lock:  # a new loop: drop the values of closed ones, then make its own
            # A value may reference its loop (a pool's connections do), so a weak key would
            # never be freed; a closed loop's value is unusable anyway.
            for old in [lp for lp in self._values if lp.is_closed()]:
                gone = self._values.pop(old)
                if self._dispose is not None:
                    self._dispose(gone)
            if loop not in self._values:
                self._values[loop] = self._factory()
            return self._values[loop]

    def values(self) -> list[T]:
        """The values held now (one per loop not yet seen closed)."""
        return list(self._values.values())

    def __len__(self) -> int:
        return len(self._values)
