"""heap.py: the glibc calls take effect where glibc is, and the opt-out is honoured."""

from __future__ import annotations

import subprocess
import sys

import pytest

from art_langgraph.runtime.heap import _libc, release_free_memory, use_mmap_for_large_blocks

glibc = pytest.mark.skipif(_libc() is None, reason="not glibc")


@glibc
def test_trim_and_threshold_take_effect_on_glibc() -> None:
    assert release_free_memory() is True
    assert use_mmap_for_large_blocks() is True


@glibc
def test_the_opt_out_leaves_glibc_alone() -> None:
    code = "from art_langgraph.runtime.heap import use_mmap_for_large_blocks as f; print(f())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"ART_MALLOC_TUNING": "0", "PATH": ""},
        check=True,
    )
    assert out.stdout.strip() == "False"
