"""Torch replicas on CUDA (marker `gpu`: skipped without CUDA): replica i on cuda:(i mod the
GPUs), both serving. Passed on a lent H200 (one GPU: both replicas on cuda:0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from art_langgraph.engine.base import SamplingParams
from art_langgraph.engine.torch_engine import TorchEngineConfig
from art_langgraph.scaleout.replicas import ReplicaEngine

pytestmark = pytest.mark.gpu


async def test_replicas_on_cuda_answer_like_one_engine(tiny_path: Path) -> None:
    engine = ReplicaEngine.start_torch(
        str(tiny_path), 2, TorchEngineConfig(), threads=1
    )  # device None: replica i on cuda:(i mod the GPUs)
    try:
        greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        prompt = engine.tokenizer.encode("count to ten")
        a = await engine.generate(prompt, greedy)
        b = await engine.generate([*prompt, 1], greedy)  # a new prompt: the other replica
        assert len(a.completion_token_ids) == len(b.completion_token_ids) == 8
        assert min(engine.router.given) >= 1
    finally:
        engine.close_sync()
