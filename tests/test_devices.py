"""The dtype rules of `art_langgraph/devices.py`: `auto` picks bfloat16 only where the CPU
multiplies it in hardware, and an explicit choice always wins."""

from __future__ import annotations

import pytest

from art_langgraph import devices


@pytest.mark.parametrize(
    ("flags", "engine", "compute"),
    [
        ({"avx2", "fma"}, "float32", "float32"),
        ({"avx2", "avx512_bf16"}, "bfloat16", "bfloat16"),
        ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16", "bfloat16"),
    ],
)
def test_auto_follows_the_cpu_flags(monkeypatch, flags, engine, compute) -> None:
    monkeypatch.setattr(devices, "cpu_flags", lambda: set(flags))
    assert devices.pick_engine_dtype(None, "cpu") == engine
    assert devices.pick_engine_dtype("auto", "cpu") == engine
    # the trainer's frozen weights follow the engine's (one shared copy); float32 weights a
    # caller chose get bfloat16 autocast where the CPU multiplies it in hardware
    assert devices.pick_dtype("auto", "cpu") == engine
    assert devices.pick_compute_dtype("auto", engine, "cpu") == engine
    assert devices.pick_compute_dtype("auto", "float32", "cpu") == compute


def test_explicit_choices_and_cuda_are_not_overridden(monkeypatch) -> None:
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"amx_bf16"})
    assert devices.pick_engine_dtype("float32", "cpu") == "float32"
    assert devices.pick_compute_dtype("float32", "float32", "cpu") == "float32"
    assert devices.pick_engine_dtype(None, "cuda") == "bfloat16"
    assert devices.pick_dtype(None, "cuda:0") == "bfloat16"
    assert devices.pick_compute_dtype("auto", "bfloat16", "cuda") == "bfloat16"
    monkeypatch.setattr(devices, "cpu_flags", lambda: set())
    assert devices.pick_compute_dtype("bfloat16", "float32", "cpu") == "bfloat16"
