"""Give freed memory back to the operating system (`release_free_memory`).

glibc keeps freed blocks below its (dynamic, up to 32 MiB) mmap threshold in its heaps.
An engine's KV cache and a trainer's activations are exactly such blocks, of sizes
that change every step, so without a trim the resident size ratchets up across a run
(measured on SmolLM2-135M over two RL steps: 3.3 GiB after evaluation, 8.7 GiB at the
end, while live tensors stayed under 3 GiB). `malloc_trim(0)` returns the free pages;
it is called when the engine's batch drains and after each training step.

Left out: other allocators (jemalloc, macOS): there the call does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

__all__ = ["release_free_memory"]


@functools.cache
def _malloc_trim() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def release_free_memory() -> bool:
    """Return free heap pages to the OS; True where the allocator supports it."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)  # type: ignore[operator]
    return True
