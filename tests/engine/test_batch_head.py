"""The batch head: rows that share a prompt head hold its KV once, and nothing changes.

Its attention equals SDPA over the head put before each row's keys (decode, forced
tokens, prefill, padded rows); the engine's greedy tokens and logprobs equal `generate`'s
with a head formed, joined, and dissolved by a row that does not share it; under a KV
budget, the head counted once lets more rows decode together."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from art_langgraph.engine import GenerateResult, SamplingParams, TorchEngine, TorchEngineConfig
from art_langgraph.engine.adapter_slots import BASE_KEY
from art_langgraph.engine.batch_head import (
    BatchHead,
    SharedCount,
    _concat_attention,
    head_attention,
    head_length,
)
from tests.engine.test_torch_engine import _greedy_reference


class _Layer(torch.nn.Module):
    layer_idx = 0


def _reference(q, k, v, hk, hv, mask):  # type: ignore[no-untyped-def]
    """SDPA over [head | row] keys, every row sees the head."""
    b = q.shape[0]
    keys = torch.cat([hk.expand(b, -1, -1, -1), k], 2)
    values = torch.cat([hv.expand(b, -1, -1, -1), v], 2)
    full = F.pad(mask, (hk.shape[2], 0), value=True)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=full, enable_gqa=True)
    return out.transpose(1, 2)


@pytest.mark.parametrize("q_len", [1, 3, 40])
def test_head_attention_equals_sdpa_over_the_head_and_each_row(q_len: int) -> None:
    torch.manual_seed(0)
    b, hq, hkv, s, p, d = 3, 6, 2, 50, 70, 16
    q = torch.randn(b, hq, q_len, d)
    k, v = torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d)
    hk, hv = torch.randn(1, hkv, p, d), torch.randn(1, hkv, p, d)
    causal = torch.ones(q_len, s, dtype=torch.bool).tril(s - q_len)
    mask = causal[None, None].repeat(b, 1, 1, 1)
    mask[1, :, :, :20] = False  # a left-padded row
    mask[2, :, 0, :] = False  # a pad query: it sees only the head
    head = BatchHead(tuple(range(p)), "base", [(hk, hv)])
    out, _ = head_attention(_Layer(), q, k, v, mask, scaling=d**-0.5, batch_head=head)
    want = _reference(q, k, v, hk, hv, mask)
    assert torch.allclose(out, want, atol=1e-5), (out - want).abs().max()
    # off the CPU the head goes before each row's keys: the same attention
    out, _ = _concat_attention(q, k, v, mask, hk, hv, d**-0.5)
    assert torch.allclose(out, want, atol=1e-5)
    if q_len > 1:  # without a mask: causal over the row's own new tokens
        out, _ = head_attention(_Layer(), q, k, v, None, scaling=d**-0.5, batch_head=head)
        want = _reference(q, k, v, hk, hv, causal[None, None].repeat(b, 1, 1, 1))
        assert torch.allclose(out, want, atol=1e-5)


def test_a_head_is_whole_blocks_of_the_common_prefix_and_long_enough() -> None:
    common = list(range(1000, 1300))
    prompts = [[*common, 1, 2], [*common, 3], [*common, 1, 5, 6]]
    assert head_length(prompts, 16) == 288  # 300 shared, cut to whole blocks
    assert head_length([[*common[:100], 1], [*common[:100], 2]], 16) == 0  # under 128
    assert head_length([common, common], 16) == 288  # each keeps a token of its own
    count = SharedCount(None, forming=True, block_size=16)
    assert count.with_row(prompts[0], "base") == 0  # one row alone forms none
    count.add(prompts[0], "base")
    assert count.with_row(prompts[1], "base") == 288
    assert count.with_row(prompts[1], "lora") == 0  # other weights: no head
    count.add(prompts[1], "base")
    assert count.with_row(prompts[2], "base") == 288


def _prompts(engine: TorchEngine, questions: list[str]) -> list[list[int]]:
    system = "You are a careful agent. Tools: weather(city), sum(a, b), search(query). " * 12
    return [
        engine.tokenizer.encode(
            str(
                engine.tokenizer.apply_chat_template(
                    [{"role": "system", "content": system}, {"role": "user", "content": q}],
                    add_generation_prompt=True,
                    tokenize=False,
                )
            ),
            add_special_tokens=False,
        )
        for q in questions
    ]


def _logprobs(engine: TorchEngine, ids: list[int], r: GenerateResult) -> torch.Tensor:
    full = torch.tensor([ids + r.completion_token_ids])
    with torch.inference_mode():
        logits = engine.base_model(full).logits[0, len(ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(r.logprobs)), r.completion_token_ids]


@pytest.fixture(scope="module")
def head_engine(tiny_path: Path):  # type: ignore[no-untyped-def]
    config = TorchEngineConfig(dtype="float32", batch_head=True)
    eng = TorchEngine.from_pretrained(str(tiny_path), config)
    yield eng
    eng.close_sync()


async def test_rows_forming_joining_and_dissolving_a_head_are_exact(
    head_engine: TorchEngine,
) -> None:
    eng = head_engine
    first = _prompts(eng, ["sum 1 2", "weather in Oslo today please", "x"])
    joins = _prompts(eng, ["search the files", "sum 3 4"])
    other = eng.tokenizer.encode("a prompt of another agent altogether", add_special_tokens=False)
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    rows_before, dissolved_before = eng.head_rows, eng._batch.dissolved

    async def later(p: list[int], steps: int) -> GenerateResult:
        start = eng.steps
        while eng.steps < start + steps:  # join a running batch
            await asyncio.sleep(0.001)
        return await eng.generate(p, greedy)

    results = await asyncio.gather(
        *(eng.generate(p, greedy) for p in first),
        *(later(p, 3) for p in joins),
        later(other, 8),
    )
    assert eng.head_rows - rows_before >= len(first) + len(joins)
    assert eng._batch.dissolved - dissolved_before == 1  # `other` shares no head
    for p, r in zip([*first, *joins, other], results, strict=True):
        assert r.completion_token_ids == _greedy_reference(eng, p, 24)
        assert torch.allclose(torch.tensor(r.logprobs), _logprobs(eng, p, r), atol=1e-4)


async def test_rows_after_a_head_go_into_the_prefix_cache_whole(head_engine: TorchEngine) -> None:
    eng = head_engine
    prompts = _prompts(eng, ["weather in Rome", "weather in Lima"])
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    results = await asyncio.gather(*(eng.generate(p, greedy) for p in prompts))
    for p, r in zip(prompts, results, strict=True):
        seen = p + r.completion_token_ids
        hit = eng.prefix_cache.lookup(BASE_KEY, seen, len(seen))
        assert hit.tokens >= len(seen) - 16  # every whole block, the head's and the row's
        again = await eng.generate(seen, SamplingParams(max_tokens=4, temperature=0))
        assert again.completion_token_ids == _greedy_reference(
            eng, seen, len(again.completion_token_ids)
        )


async def test_a_head_counted_once_lets_more_rows_decode_together(tiny_path: Path) -> None:
    most: dict[bool, int] = {}
    for on in (False, True):
        eng = TorchEngine.from_pretrained(str(tiny_path), TorchEngineConfig(dtype="float32"))
        prompts = _prompts(eng, [f"sum {k} {k + 1}" for k in range(8)])
        width = max(len(p) for p in prompts) + 16
        per_token = eng._inbox.kv_token_bytes
        eng.close_sync()
        budget = 3 * width * per_token + per_token  # 3 rows at their widest, each whole
        config = TorchEngineConfig(dtype="float32", max_kv_bytes=budget, batch_head=on)
        eng = TorchEngine.from_pretrained(str(tiny_path), config)
        try:
            peak = 0

            async def watch(e: TorchEngine = eng) -> None:
                nonlocal peak
                while True:
                    peak = max(peak, e.active)
                    await asyncio.sleep(0.001)

            watcher = asyncio.create_task(watch())
            greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
            results = await asyncio.gather(*(eng.generate(p, greedy) for p in prompts))
            watcher.cancel()
            most[on] = peak
            for p, r in zip(prompts, results, strict=True):
                assert r.completion_token_ids == _greedy_reference(eng, p, 16)
        finally:
            eng.close_sync()
    assert most[False] == 3 and most[True] == 8


async def test_forced_tokens_after_a_head_match_an_engine_without_one(tiny_path: Path) -> None:
    """Grammar-constrained rows (a forced tool call's runs fed in one forward) after a
    head: the same tokens and logprobs as an engine whose rows each hold the whole prompt."""
    schema = {
        "type": "object",
        "properties": {"name": {"enum": ["weather", "sum", "search"]}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    out: dict[bool, list[GenerateResult]] = {}
    for on in (True, False):
        eng = TorchEngine.from_pretrained(
            str(tiny_path), TorchEngineConfig(dtype="float32", batch_head=on)
        )
        try:
            g = eng.grammars.json_schema(schema)
            prompts = _prompts(eng, ["call a tool", "call another", "one more call"])
            sampling = [SamplingParams(max_tokens=30, seed=s, grammar=g) for s in range(3)]
            out[on] = list(
                await asyncio.gather(
                    *(eng.generate(p, s) for p, s in zip(prompts, sampling, strict=True))
                )
            )
            assert (eng.head_rows > 0) == on and eng.forced_tokens > 0
        finally:
            eng.close_sync()
    for a, b in zip(out[True], out[False], strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


async def test_a_batch_formed_by_one_row_condenses_its_head_when_others_join(
    head_engine: TorchEngine,
) -> None:
    """An evaluation's first request can arrive alone: no head forms. When rows sharing
    its head join, the head is taken out of the running rows, and every row stays exact."""
    eng = head_engine
    alone, *joins = _prompts(eng, ["sum 5 6", "weather in Kyiv", "x y", "search for it"])
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    condensed, rows = eng._batch.condensed, eng.head_rows

    async def joined() -> list[GenerateResult]:
        start = eng.steps
        while eng.steps < start + 3:
            await asyncio.sleep(0.001)
        return list(await asyncio.gather(*(eng.generate(p, greedy) for p in joins)))

    first, rest = await asyncio.gather(eng.generate(alone, greedy), joined())
    assert eng._batch.condensed - condensed == 1 and eng.head_rows - rows >= len(joins)
    for p, r in zip([alone, *joins], [first, *rest], strict=True):
        assert r.completion_token_ids == _greedy_reference(eng, p, 24)
        assert torch.allclose(torch.tensor(r.logprobs), _logprobs(eng, p, r), atol=1e-4)
