"""The torch engine's prefix cache: exact, isolated per adapter load, bounded by its budget.

Each test runs the same requests on two engines over the same tiny weights, one with the
prefix cache (the default) and one without (`prefix_cache_bytes=0`), and compares what
they return: greedy tokens exactly, logprobs within `FP32_TOL` (fp32) or `BF16_TOL`
(bf16). Measured on this machine (2 AVX2 cores): the largest logprob difference over the
chain and group tests was 1.9e-6 in fp32, and 0 over the bf16 chain; the tolerances are
ceilings for CPUs whose kernels round differently by batch shape. The isolation tests
fail if stale KV is served: a swap must report `cached_tokens == 0` and match an engine
that never held the old weights (removing the identity change made it fail: 224 cached
tokens).
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from art_langgraph.engine import GenerateResult, SamplingParams, TorchEngine, TorchEngineConfig
from art_langgraph.engine.budgets import device_memory, kv_token_bytes, prefix_budget
from art_langgraph.engine.prefix_cache import PrefixCache
from art_langgraph.errors import UsageError
from tests.conftest import FP32

FP32_TOL = 1e-4
BF16_TOL = 0.1

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tiny_path: Path) -> Iterator[tuple[TorchEngine, TorchEngine]]:
    """(cached, plain) engines on the same tiny weights, fp32."""
    cached = TorchEngine.from_pretrained(str(tiny_path), FP32)
    plain = TorchEngine.from_pretrained(
        str(tiny_path), TorchEngineConfig(dtype="float32", prefix_cache_bytes=0)
    )
    yield cached, plain
    cached.close_sync()
    plain.close_sync()


def _turn(engine: TorchEngine, text: str, system: str = "") -> list[int]:
    messages = [{"role": "user", "content": text}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    rendered = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    return list(engine.tokenizer.encode(str(rendered), add_special_tokens=False))


SYSTEM = "You are an agent with tools for lookups of capitals, currencies and sums. " * 6


def _same(a: GenerateResult, b: GenerateResult, tol: float = FP32_TOL) -> float:
    """Assert equal tokens and close logprobs; return the largest logprob difference."""
    assert a.completion_token_ids == b.completion_token_ids
    diff = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
    assert diff <= tol, diff
    return diff


async def _chain(
    engine: TorchEngine, first: list[int], turns: int, adapter: str | None = None
) -> list[GenerateResult]:
    """An agent's chain: each prompt is the previous prompt + completion + a new turn."""
    out: list[GenerateResult] = []
    prompt = first
    for t in range(turns):
        r = await engine.generate(prompt, GREEDY, adapter=adapter)
        out.append(r)
        prompt = prompt + r.completion_token_ids + _turn(engine, f"tool result {t} " * 3)
    return out


async def test_multi_turn_chain_reuses_its_history_and_changes_nothing(
    pair: tuple[TorchEngine, TorchEngine],
) -> None:
    cached, plain = pair
    first = _turn(cached, "what is the capital of France?", SYSTEM)
    got = await _chain(cached, first, 3)
    want = await _chain(plain, first, 3)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    assert all(w.cached_tokens == 0 for w in want)
    # Turn 2 and 3 reuse all but the last partial block of what turn 1 and 2 computed.
    bs = cached.prefix_cache.block_size
    for prev, g in itertools.pairwise(got):
        computed = len(prev.prompt_token_ids) + len(prev.completion_token_ids) - 1
        assert g.cached_tokens == computed // bs * bs > 0
    m = cached.metrics()
    assert m.prefix_cache_hits >= sum(g.cached_tokens for g in got)
    assert 0 < m.prefix_cache_bytes <= m.prefix_cache_capacity_bytes


async def test_concurrent_groups_and_late_members_are_exact(
    pair: tuple[TorchEngine, TorchEngine],
) -> None:
    """A GRPO group: members admitted together share their head, members arriving later
    reuse it from the cache; sampled (seeded) and greedy rows alike."""
    cached, plain = pair
    prompts = [_turn(cached, f"question {q}: the capital of {q}?", SYSTEM) for q in "ABC"]

    async def run(engine: TorchEngine) -> list[GenerateResult]:
        async def one(i: int, p: list[int]) -> GenerateResult:
            await asyncio.sleep(0.02 * (i % 3))
            sampling = GREEDY if i % 2 else SamplingParams(max_tokens=8, seed=i, ignore_eos=True)
            return await engine.generate(p, sampling)

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts * 3)))

    got, want = await run(cached), await run(plain)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    assert sum(g.cached_tokens for g in got) > 0


async def test_mixed_adapters_in_one_batch_each_reuse_their_own_kv(
    pair: tuple[TorchEngine, TorchEngine], lora_adapter: Path
) -> None:
    cached, plain = pair
    for e in pair:
        await e.load_adapter("mix", str(lora_adapter))
    try:
        first = _turn(cached, "mixed batch", SYSTEM)
        adapters = [None, "mix", None, "mix"]

        async def run(engine: TorchEngine) -> list[list[GenerateResult]]:
            return list(await asyncio.gather(*(_chain(engine, first, 2, a) for a in adapters)))

        got, want = await run(cached), await run(plain)
        for gs, ws in zip(got, want, strict=True):
            for g, w in zip(gs, ws, strict=True):
                _same(g, w)
        assert got[0][0].completion_token_ids != got[1][0].completion_token_ids
        assert all(chain[1].cached_tokens > 0 for chain in got)
    finally:
        for e in pair:
            await e.unload_adapter("mix")


@pytest.fixture
def other_adapter(lora_adapter: Path, tmp_path: Path) -> Path:
    """The same LoRA settings as `lora_adapter`, other weights (a later training step)."""
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other"
    shutil.copytree(lora_adapter, other)
    file = other / "adapter_model.safetensors"
    save_file({k: -0.5 * v for k, v in load_file(str(file)).items()}, str(file))
    return other


async def test_kv_of_replaced_adapter_weights_is_never_served(
    pair: tuple[TorchEngine, TorchEngine], lora_adapter: Path, other_adapter: Path
) -> None:
    """A swap (same name, new weights), and a load into a freed slot (same peft key, new
    weights): the next request computes its prompt afresh, and matches an engine that
    never saw the old weights."""
    cached, plain = pair
    prompt = _turn(cached, "after the swap", SYSTEM)
    warm = await cached.generate(prompt, GREEDY, adapter=None)  # base KV: must stay usable
    await cached.load_adapter("keep", str(other_adapter))  # a slot is spared only beside it
    await cached.load_adapter("swap", str(lora_adapter))
    old = await cached.generate(prompt, GREEDY, adapter="swap")
    assert (await cached.generate(prompt, GREEDY, adapter="swap")).cached_tokens > 0

    await cached.load_adapter("swap", str(other_adapter))  # a training step's swap
    await plain.load_adapter("swap", str(other_adapter))
    new = await cached.generate(prompt, GREEDY, adapter="swap")
    assert new.cached_tokens == 0
    diff = _same(new, await plain.generate(prompt, GREEDY, adapter="swap"))
    assert max(abs(a - b) for a, b in zip(new.logprobs, old.logprobs, strict=True)) > 10 * diff

    # Free the slot, load other weights into the same peft key under a new name.
    await cached.unload_adapter("swap")
    spare = cached._slots.spare  # a slot that served other weights before
    assert spare is not None
    await cached.load_adapter("slot", str(lora_adapter))
    assert cached._slots.adapters["slot"] == spare  # written in place
    again = await cached.generate(prompt, GREEDY, adapter="slot")
    assert again.cached_tokens == 0
    _same(again, old)
    base = await cached.generate(prompt, GREEDY)
    assert base.cached_tokens > 0
    _same(base, warm)
    for name in ("slot", "keep"):
        await cached.unload_adapter(name)
    await plain.unload_adapter("swap")


async def test_eviction_under_a_tiny_budget_stays_exact(
    tiny_path: Path, pair: tuple[TorchEngine, TorchEngine]
) -> None:
    plain = pair[1]
    block = kv_token_bytes(plain.model.config, torch.float32) * 16  # one fp32 block
    small = TorchEngine.from_pretrained(
        str(tiny_path), TorchEngineConfig(dtype="float32", prefix_cache_bytes=6 * block)
    )
    try:
        prompts = [_turn(small, f"eviction {i} " * 40) for i in range(3)]
        for p in prompts * 2:
            for g, w in zip(await _chain(small, p, 2), await _chain(plain, p, 2), strict=True):
                _same(g, w)
        m = small.metrics()
        assert m.prefix_cache_evictions > 0
        assert m.prefix_cache_bytes <= 6 * block
        assert len(small.prefix_cache) <= 6
    finally:
        small.close_sync()


async def test_bf16_reuse_matches_bf16_without_the_cache(tiny_path: Path) -> None:
    """In bf16, the first token's distribution at every turn of a chain (prompt from the
    cache, or computed) agrees within `BF16_TOL`."""
    engines = [
        TorchEngine.from_pretrained(
            str(tiny_path), TorchEngineConfig(dtype="bfloat16", prefix_cache_bytes=b)
        )
        for b in (None, 0)
    ]
    try:
        one = SamplingParams(max_tokens=1, temperature=0, top_logprobs=5)
        prompt = _turn(engines[0], "bf16 chain", SYSTEM)
        hits = 0
        for t in range(3):
            a, b = [await e.generate(prompt, one) for e in engines]
            hits += a.cached_tokens
            top_a, top_b = dict(a.top_logprobs[0]), dict(b.top_logprobs[0])  # type: ignore[index]
            for tok in set(top_a) & set(top_b):
                assert abs(top_a[tok] - top_b[tok]) <= BF16_TOL
            assert len(set(top_a) & set(top_b)) >= 3
            prompt = prompt + b.completion_token_ids
            prompt += _turn(engines[0], f"turn {t} " * 4)
        assert hits > 0
    finally:
        for e in engines:
            e.close_sync()


def test_budgets_are_checked_at_construction(tiny_path: Path) -> None:
    with pytest.raises(UsageError, match="prefix_cache_bytes must be >= 0"):
        TorchEngineConfig(prefix_cache_bytes=-1)
    with pytest.raises(UsageError, match="block_size"):
        TorchEngineConfig(prefix_cache_block_size=0)
    with pytest.raises(UsageError, match="more than the cpu device's memory"):
        TorchEngine.from_pretrained(str(tiny_path), TorchEngineConfig(prefix_cache_bytes=1 << 60))


def test_the_cpu_default_budget_is_a_64th_of_ram_at_most_256_mib() -> None:
    # bench.engine_memory: 256 MiB served 81% of an evaluation's prompt tokens against 84%
    # for 753 MiB, as fast and 0.46 GiB lower; RAM grows the budget no further
    cpu = torch.device("cpu")
    ram = device_memory(cpu)
    assert prefix_budget(None, cpu) == min(ram // 64, 256 << 20)
    assert prefix_budget(None, cpu) <= 256 << 20 and prefix_budget(0, cpu) == 0


def test_eviction_takes_leaves_first() -> None:
    """A chain is shortened from its end: a prefix that is kept stays reachable."""
    import torch

    cache = PrefixCache(budget_bytes=4 * 16, block_size=2)  # 4 blocks of (1, 2, 1, 2, 1) fp32

    def layers(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        t = torch.arange(n, dtype=torch.float32).view(1, n, 1)  # (H, T, D)
        return [(t, t + 100)]

    assert cache.insert("w", [1, 2, 3, 4, 5, 6], layers(6), torch.arange(6)) == 3
    hit = cache.lookup("w", [1, 2, 3, 4, 5, 6, 7], 7)
    assert hit.tokens == 6
    assert hit.stacked()[:, 0, 1, 0, :, 0].flatten().tolist() == [100, 101, 102, 103, 104, 105]
    assert cache.insert("w", [1, 2, 9, 9, 9, 9], layers(6), torch.arange(6)) == 2  # evicts one
    assert cache.evictions == 1
    assert cache.lookup("w", [1, 2, 3, 4, 5, 6, 7], 7).tokens == 4  # [5, 6] went first
    assert cache.lookup("w", [1, 2, 9, 9, 9, 9, 0], 7).tokens == 6
    assert cache.lookup("other", [1, 2, 3, 4], 4).tokens == 0
    cache.retire("w")
    assert len(cache) == 0 and cache.lookup("w", [1, 2, 3], 3).tokens == 0
    assert cache.insert("w", [1, 2, 3], layers(3), torch.arange(3)) == 0  # a retired identity


async def test_reset_prefix_cache_frees_it_and_the_next_turn_recomputes(tiny_path: Path) -> None:
    """The backend's hook before a paused training step (`InferenceEngine.reset_prefix_cache`):
    the cache holds nothing after it, and the same chain still answers exactly."""
    engine = TorchEngine.from_pretrained(str(tiny_path), FP32)
    try:
        first = _turn(engine, "what is the capital of Peru?", SYSTEM)
        before = await _chain(engine, first, 2)
        assert engine.metrics().prefix_cache_bytes > 0
        await engine.reset_prefix_cache()
        assert engine.metrics().prefix_cache_bytes == 0 and len(engine.prefix_cache) == 0
        after = await _chain(engine, first, 2)
        assert after[0].cached_tokens == 0  # nothing was left to reuse
        for g, w in zip(after, before, strict=True):
            _same(g, w)
    finally:
        engine.close_sync()


def test_a_pinned_chain_is_never_evicted_and_inserts_cache_less() -> None:
    """`PrefixCache.pin`: a waiting request's chain stays however much is inserted after
    it; with no unpinned room left an insert caches less; `unpin` frees it again."""
    import torch

    cache = PrefixCache(budget_bytes=4 * 16, block_size=2)  # 4 blocks

    def layers(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        t = torch.arange(n, dtype=torch.float32).view(1, n, 1)
        return [(t, t + 100)]

    cache.insert("w", [1, 2, 3, 4], layers(4), torch.arange(4))
    hit = cache.lookup("w", [1, 2, 3, 4, 5], 5)
    cache.pin(hit.blocks)
    assert cache.pinned == 2
    assert cache.insert("w", [7, 7, 8, 8, 9, 9], layers(6), torch.arange(6)) == 2  # room for 2
    assert cache.lookup("w", [1, 2, 3, 4, 5], 5).tokens == 4
    assert cache.insert("w", [5, 5, 6, 6], layers(4), torch.arange(4)) == 2  # evicts [7, 8]
    assert cache.lookup("w", [1, 2, 3, 4, 5], 5).tokens == 4 and cache.evictions == 2
    cache.unpin(hit.blocks)
    assert cache.pinned == 0
    assert cache.insert("w", [3, 3, 4, 4, 6, 6, 8, 8], layers(8), torch.arange(8)) == 4
    assert cache.lookup("w", [1, 2, 3, 4, 5], 5).tokens == 0  # unpinned: evicted


async def test_a_queued_turn_keeps_its_history_while_others_fill_the_cache(
    tiny_path: Path, pair: tuple[TorchEngine, TorchEngine]
) -> None:
    """An agent's next turn queued behind other requests (one row at a time) starts from
    its history: the engine pins it on arrival. Under plain LRU the others' inserts
    evicted it (0 cached tokens: the case of an evaluation with every episode in flight)."""
    plain = pair[1]
    block = kv_token_bytes(plain.model.config, torch.float32) * 16  # one fp32 block
    engine = TorchEngine.from_pretrained(
        str(tiny_path),
        TorchEngineConfig(dtype="float32", prefix_cache_bytes=18 * block, max_batch_size=1),
    )
    try:
        first = _turn(engine, "queued agent " * 12)
        turn1 = await engine.generate(first, GREEDY)
        second = first + turn1.completion_token_ids + _turn(engine, "tool result " * 3)
        others = [_turn(engine, f"{i} other request " * 12) for i in range(4)]
        *_, got = await asyncio.gather(
            *(engine.generate(p, GREEDY) for p in others), engine.generate(second, GREEDY)
        )
        assert got.cached_tokens >= len(first) // 16 * 16
        _same(got, await plain.generate(second, GREEDY))
        assert engine.metrics().prefix_cache_evictions > 0
        assert engine.prefix_cache.pinned == 0
    finally:
        engine.close_sync()
