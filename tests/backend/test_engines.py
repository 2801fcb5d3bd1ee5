"""Which engine a LocalBackend starts (`backend/engines.py`): the choice, resolved, and one
started for real (the backends' own tests start the others: replicas, vLLM, Ray)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from art_langgraph.backend.engines import EngineChoice, start_engine
from art_langgraph.engine import InferenceEngine, TorchEngine


def test_auto_is_torch_on_a_cpu_and_a_named_kind_stays() -> None:
    assert EngineChoice("auto", device="cpu").resolved_kind() == "torch"
    assert EngineChoice("vllm", device="cpu").resolved_kind() == "vllm"
    assert EngineChoice("torch").resolved_kind() == "torch"


def test_one_torch_engine_starts_as_the_protocol_and_holds_no_ray(
    tiny_path: Path, tmp_path: Path
) -> None:
    started = start_engine(EngineChoice("torch", device="cpu"), str(tiny_path), tmp_path, 8, 1)
    try:
        assert isinstance(started.engine, TorchEngine)
        assert isinstance(started.engine, InferenceEngine)  # the protocol, vocab_size included
        assert started.engine.vocab_size > 0
        assert started.ray is None and not started.ray_started
    finally:
        asyncio.run(started.engine.close())
