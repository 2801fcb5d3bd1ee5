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


_HELD = """
import torch
from art_langgraph.runtime.heap import held_free_bytes, release_if_held_over
blocks = [torch.ones((1 << 18) + 1024 * i) for i in range(300)]  # 1-2 MiB each, sizes apart
del blocks
held = held_free_bytes()
print(held > 256 << 20, release_if_held_over(held + 1), release_if_held_over(256 << 20),
      held_free_bytes() < 64 << 20)
"""


def test_the_engine_hands_back_what_tcmalloc_holds_past_the_bound() -> None:
    from art_langgraph.runtime.allocator import allocator_path

    path = allocator_path()
    if path is None:
        pytest.skip("tcmalloc is not installed here")
    env = {**__import__("os").environ, "LD_PRELOAD": path}
    out = subprocess.run([sys.executable, "-c", _HELD], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "False", "True", "True"], out.stderr
    # off tcmalloc: nothing to ask, nothing released
    glibc = "from art_langgraph.runtime.heap import *; print(held_free_bytes(), release_if_held_over(0))"
    plain = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", glibc], env=plain, capture_output=True, text=True)
    assert out.stdout.split() == ["None", "False"], out.stderr
