"""The torch engine on CUDA in bf16: batching stays exact and logprobs stay close."""

from __future__ import annotations

import asyncio

import pytest
import torch

from art_langgraph.engine import SamplingParams, TorchEngine, TorchEngineConfig

pytestmark = pytest.mark.gpu


async def test_cuda_bf16_engine_matches_generate(tiny_path) -> None:  # type: ignore[no-untyped-def]
    engine = TorchEngine.from_pretrained(str(tiny_path), TorchEngineConfig(device="cuda"))
    try:
        assert (
            engine.device.type == "cuda" and next(engine.model.parameters()).dtype == torch.bfloat16
        )
        prompts = [engine.tokenizer.encode("word " * k) for k in (3, 30, 90)]
        greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        results = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
        for p, r in zip(prompts, results, strict=True):
            with torch.inference_mode():
                full = torch.tensor([p + r.completion_token_ids], device="cuda")
                logits = engine.model(full).logits[0, len(p) - 1 : -1].float()
            want = torch.log_softmax(logits, -1).gather(1, full[0, len(p) :, None])[:, 0].cpu()
            assert torch.allclose(torch.tensor(r.logprobs), want, atol=0.1)
        seeded = SamplingParams(max_tokens=8, seed=3)
        a, b = await asyncio.gather(
            engine.generate(prompts[0], seeded), engine.generate(prompts[0], seeded)
        )
        assert a.completion_token_ids == b.completion_token_ids
    finally:
        await engine.close()
