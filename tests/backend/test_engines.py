"""Which engine a LocalBackend starts (`backend/engines.py`): the choice, resolved, and one
started for real, with the traits it tells the backend (the backends' own tests start the
others: replicas, vLLM, Ray)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from art_langgraph.backend.choices import EngineChoice
from art_langgraph.backend.engines import start_engine
from art_langgraph.engine import EngineTraits, InferenceEngine, TorchEngine


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
        # what a backend training beside it reads: our engine shares its weights, any rank loads
        assert started.engine.traits == EngineTraits(
            weights_dtype=str(started.engine.shared_base.dtype).removeprefix("torch."),
            shared_base=started.engine.shared_base,
        )
    finally:
        asyncio.run(started.engine.close())
