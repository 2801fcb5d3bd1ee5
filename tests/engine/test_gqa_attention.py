"""The engine's CPU attention (`engine/gqa_attention.py`): grouped-query heads handed to
SDPA without copies give transformers' output, and the engine runs it; with its prefill
over a prefix-cache hit (several query tokens under a mask, the case it changes), the
engine's tokens and logprobs equal a fresh model's under transformers' own SDPA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from art_langgraph.engine import SamplingParams, TorchEngine
from art_langgraph.engine.gqa_attention import GQA_ATTENTION, gqa_attention
from tests.conftest import FP32
from tests.engine.test_torch_engine import _prompt


class _Attn(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize("q", [1, 4, 9])
@pytest.mark.parametrize("kind", ["bool", "float", "none"])
def test_it_equals_transformers_sdpa(q: int, kind: str) -> None:
    torch.manual_seed(q)
    b, kv, s, d = 3, 2, 20, 8
    query = torch.randn(b, kv * 3, q, d)
    key, value = torch.randn(b, kv, s, d), torch.randn(b, kv, s, d)
    mask = torch.ones(b, 1, q, s, dtype=torch.bool).tril(s - q)
    mask[0, :, :, :5] = False  # a left-padded row
    attn_mask = {
        "bool": mask,
        "float": torch.zeros(b, 1, q, s).masked_fill(~mask, float("-inf")),
        "none": None,
    }[kind]
    if kind == "none":
        key, value = key[:, :, :q], value[:, :, :q]  # causal over the fed tokens alone
    ours, _ = gqa_attention(_Attn(), query, key, value, attn_mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(_Attn(), query, key, value, attn_mask, scaling=0.3)
    assert ours.shape == (b, q, kv * 3, d)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


async def test_the_engine_runs_it_and_matches_transformers_own(tiny_path: Path) -> None:
    engine = TorchEngine.from_pretrained(str(tiny_path), FP32)
    try:
        assert engine.model.config._attn_implementation == GQA_ATTENTION
        head = _prompt(engine, "word " * 30)
        greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        await engine.generate(head, greedy)  # fills the prefix cache
        prompt = _prompt(engine, "word " * 30 + "and then some more words")
        r = await engine.generate(prompt, greedy)  # prefills its tail over the cached head
        assert engine.metrics().prefix_cache_hits > 0
    finally:
        engine.close_sync()
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_path), attn_implementation="sdpa")
    ids = torch.tensor([prompt + r.completion_token_ids])
    with torch.inference_mode():
        out = ref.generate(ids[:, : len(prompt)], max_new_tokens=8, min_new_tokens=8,
                           do_sample=False)  # fmt: skip
        logits = ref(ids).logits[0, len(prompt) - 1 : -1]
    assert out[0, len(prompt) :].tolist() == r.completion_token_ids
    want = torch.log_softmax(logits.float(), -1).gather(1, ids[0, len(prompt) :, None])[:, 0]
    torch.testing.assert_close(torch.tensor(r.logprobs), want, rtol=0, atol=1e-4)
