"""Give freed memory back to the operating system.

glibc keeps freed blocks below its mmap threshold in its heaps, and raises that
threshold (up to 32 MiB) each time a large mmapped block is freed. An engine's KV
cache and a trainer's activations are exactly such blocks, of sizes that change every
step, so the resident size ratchets up across a run (measured on SmolLM2-135M over two
RL steps: 3.3 GiB after evaluation, 8.7 GiB at the end, while live tensors stayed
under 3 GiB). Two remedies, both process-wide and idempotent:

- `use_mmap_for_large_blocks()` fixes the threshold at 1 MiB (`mallopt`), so every
  block that large is its own mapping, returned the moment it is freed. The engine calls
  it on the CPU. Measured (bench/probes/engine_kv.py, 36 rows x 256 tokens on SmolLM2): peak
  RSS 2914 -> 2182 MiB for +4% wall time (64 KiB: 2147 MiB, +14%); on the untrained
  SmolLM2 evaluation (36 agent rollouts, 64 KiB): 5.6 -> 3.3 GiB. Not for the trainer:
  there fresh mappings for every activation doubled the step time (33 -> 64 s); it
  trims instead. Set `ART_MALLOC_TUNING=0` to leave glibc alone.
- `release_free_memory()` (`malloc_trim(0)`) returns free heap pages; called when the
  engine's batch drains and after each training step.

On tcmalloc (`art_langgraph/runtime/allocator.py`) the mallopt threshold means nothing, and
`release_free_memory()` asks tcmalloc to return its free spans instead.

Left out: other allocators (jemalloc, musl, macOS): there both calls do nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_tuned_threshold: int | None = None  # set once use_mmap_for_large_blocks() took effect


@functools.cache
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 (glibc only: musl lacks them)
    except (OSError, AttributeError):
        return None
    return libc


def _malloc_trim() -> Any:
    libc = _libc()
    return None if libc is None else libc.malloc_trim


@functools.cache
def use_mmap_for_large_blocks(threshold: int = 1 << 20) -> bool:
    """Serve blocks of `threshold` bytes or more from their own mappings (see above).
    Process-wide; the first call's threshold holds."""
    libc = _libc()
    if libc is None or os.environ.get("ART_MALLOC_TUNING", "1") == "0":
        return False
    global _tuned_threshold
    if libc.mallopt(_M_MMAP_THRESHOLD, threshold):
        _tuned_threshold = threshold
    return _tuned_threshold is not None


_HEAP_MAX_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64-bit


@contextlib.contextmanager
def heap_for_large_blocks() -> Iterator[None]:
    """While a training step runs, serve large blocks from the heap again (threshold 32
    MiB): the trainer frees and reallocates its activations every micro-batch, and fresh
    mappings for each made an in-process step about 2x slower (bench/rl_step, tiny: train
    0.95 -> 0.49 s). The engine's 1 MiB threshold is back on exit, and the caller trims."""
    libc, engine_threshold = _libc(), _tuned_threshold
    if libc is None or engine_threshold is None:  # glibc left alone: nothing to undo
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_MAX_THRESHOLD)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, engine_threshold)


@functools.cache
def _tcmalloc_release() -> Any:
    """tcmalloc's `MallocExtension_ReleaseFreeMemory` where tcmalloc is this process's
    malloc (`art_langgraph/runtime/allocator.py`), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).MallocExtension_ReleaseFreeMemory
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return free heap pages to the OS; True where the allocator supports it. On tcmalloc
    (which keeps freed spans for reuse), its free spans: the engine's KV cache of a drained
    batch, a training step's activations."""
    release = _tcmalloc_release()
    if release is not None:
        release()
        return True
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)  # type: ignore[operator]
    return True
