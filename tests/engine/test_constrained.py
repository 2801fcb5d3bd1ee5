"""Grammar plumbing: the bitmask unpacking agrees with llguidance's own application, and
fast-forward through forced tokens gives what one step a token gives, in fewer steps."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import llguidance.torch
import pytest
import torch

from art_langgraph.engine import SamplingParams, TorchEngineConfig
from art_langgraph.engine.constrained import only_token, unpack_bitmask
from art_langgraph.engine.fast_forward import forced_width
from art_langgraph.engine.torch_engine import TorchEngine
from art_langgraph.errors import UsageError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather_for_city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
        },
    },
]


def test_unpack_bitmask_matches_llguidance() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 2000
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (3, (vocab + 31) // 32), dtype=torch.int32, generator=gen
    )
    logits = torch.randn(3, vocab, generator=gen)
    want = logits.clone()
    llguidance.torch.apply_token_bitmask_inplace(want, bitmask)
    got = logits.masked_fill(~unpack_bitmask(bitmask, vocab), float("-inf"))
    assert torch.equal(got, want)


def test_bad_constraints_are_usage_errors(engine: TorchEngine) -> None:
    with pytest.raises(UsageError):
        engine.grammars.structured({"grammar": "start: ???"})
    with pytest.raises(UsageError):
        engine.grammars.structured({"choice": []})
    with pytest.raises(UsageError):
        engine.grammars.tool_calls([])
    assert engine.grammars.structured({"choice": ["yes", "no"]})
    assert engine.grammars.structured({"regex": "[a-z]{3}"})


def test_only_token_reads_a_single_allowed_token() -> None:
    row = torch.zeros(4, dtype=torch.int32)
    assert only_token(row) is None
    row[2] = 1 << 5
    assert only_token(row) == 2 * 32 + 5
    row[2] = -(2**31)  # bit 31, the sign bit of an int32 word
    assert only_token(row) == 2 * 32 + 31
    row[2] |= 1
    assert only_token(row) is None
    row[2], row[0] = 1, 1
    assert only_token(row) is None


def test_forced_width_keeps_pads_below_real_tokens() -> None:
    assert forced_width([0, 0, 0]) == 0
    assert forced_width([4, 4, 4]) == 4
    assert forced_width([6, 0, 0, 0]) == 0  # one row's run would pad the three others
    assert forced_width([6, 6, 0, 0]) == 6
    assert forced_width([8, 2, 2, 0]) == 2
    assert forced_width([4, 4, 0, 0]) == 4
    # guesses count by their rows' record: two rows that kept a quarter do not pad two more
    assert forced_width([4, 4, 0, 0], [0.25, 0.25, 1.0, 1.0]) == 0


@pytest.fixture(scope="module")
def stepwise(tiny_path: Path) -> Iterator[TorchEngine]:
    """The tiny model with fast-forward and guesses off: one decode step a token."""
    config = TorchEngineConfig(dtype="float32", fast_forward=False, speculative_tokens=0)
    eng = TorchEngine.from_pretrained(str(tiny_path), config)
    yield eng
    eng.close_sync()


async def _batch(engine: TorchEngine, max_tokens: int = 60) -> list:  # type: ignore[type-arg]
    g = engine.grammars.tool_calls(TOOLS)
    prompts = [engine.tokenizer.encode(f"call {i} " * (2 + 3 * i)) for i in range(5)]
    calls = [
        engine.generate(
            p, SamplingParams(max_tokens=max_tokens, temperature=0, grammar=g, top_logprobs=2)
        )
        for p in prompts
    ]
    free = engine.generate(prompts[1], SamplingParams(max_tokens=25, temperature=0))
    return list(await asyncio.gather(*calls, free))


@pytest.mark.parametrize("max_tokens", [60, 7])
async def test_fast_forward_gives_the_stepwise_tokens_and_logprobs(
    engine: TorchEngine, stepwise: TorchEngine, max_tokens: int
) -> None:
    """Forced tool-call tokens fed in runs: the same tokens, logprobs and top pairs as one
    step a token, beside an unconstrained row, within max_tokens, in fewer steps."""
    steps, forced = engine.steps, engine.forced_tokens
    got = await _batch(engine, max_tokens)
    want = await _batch(stepwise, max_tokens)
    assert engine.forced_tokens - forced > 0 and stepwise.forced_tokens == 0
    for a, b in zip(got, want, strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.finish_reason == b.finish_reason
        assert len(a.completion_token_ids) <= max(max_tokens, 25)
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        for top_a, top_b in zip(a.top_logprobs or [], b.top_logprobs or [], strict=True):
            assert [t for t, _ in top_a] == [t for t, _ in top_b]
    if max_tokens == 60:
        assert engine.steps - steps < max(len(r.completion_token_ids) for r in want)


async def test_fast_forward_keeps_the_prefix_cache_right(
    engine: TorchEngine, stepwise: TorchEngine
) -> None:
    """A fast-forwarded row's KV (pads between its runs) goes into the prefix cache under
    its real tokens: a next turn that extends it reuses it and decodes as a fresh prefill."""
    g = engine.grammars.tool_calls(TOOLS)
    greedy = SamplingParams(max_tokens=40, temperature=0, grammar=g)
    first = await asyncio.gather(
        *(
            engine.generate(engine.tokenizer.encode(f"turn {i} " * (4 + i)), greedy)
            for i in range(3)
        )
    )
    follow = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for r in first:
        turn = r.prompt_token_ids + r.completion_token_ids + engine.tokenizer.encode(" next")
        again = await engine.generate(turn, follow)
        fresh = await stepwise.generate(turn, follow)
        assert again.cached_tokens >= len(r.prompt_token_ids) // 16 * 16
        assert again.completion_token_ids == fresh.completion_token_ids


async def test_a_row_ending_on_a_forced_token_caches_its_whole_completion(
    engine: TorchEngine, stepwise: TorchEngine
) -> None:
    """A single call's grammar stops on its forced closing tag, fed with the rest of the run:
    the row's KV then holds every token, and the next turn reuses its completion too (it
    reused only the prompt when retirement assumed the last token unfed)."""
    unit = TOOLS[0]["function"]["parameters"]["properties"]["unit"]
    pick = {"name": "pick", "parameters": {"type": "object", "properties": {"unit": unit}}}
    g = engine.grammars.tool_calls([{"type": "function", "function": pick}], parallel=False)
    greedy = SamplingParams(max_tokens=60, temperature=0, grammar=g)
    bs = engine.prefix_cache.block_size
    follow = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for i in range(3):
        r = await engine.generate(engine.tokenizer.encode(f"weather {i} " * (3 + i)), greedy)
        assert r.finish_reason == "stop"
        seen = r.prompt_token_ids + r.completion_token_ids
        again = await engine.generate(seen + engine.tokenizer.encode(" next"), follow)
        assert again.cached_tokens >= (len(seen) - 1) // bs * bs > len(r.prompt_token_ids)
        fresh = await stepwise.generate(seen + engine.tokenizer.encode(" next"), follow)
        assert again.completion_token_ids == fresh.completion_token_ids


async def test_fast_forward_sampling_is_seeded_and_valid(engine: TorchEngine) -> None:
    g = engine.grammars.tool_calls(TOOLS, parallel=False)
    sampled = SamplingParams(max_tokens=80, temperature=1.0, seed=3, grammar=g)
    prompt = engine.tokenizer.encode("weather please")
    a, b = await asyncio.gather(engine.generate(prompt, sampled), engine.generate(prompt, sampled))
    assert a.completion_token_ids == b.completion_token_ids
    text = engine.tokenizer.decode(a.completion_token_ids, skip_special_tokens=True)
    if a.finish_reason == "stop":
        assert text.startswith("<tool_call>") and text.rstrip().endswith("</tool_call>")


def test_forced_run_hands_the_sampler_the_mask_after_it(engine: TorchEngine) -> None:
    """The read-ahead's last mask is the matcher's mask now: the sampler reuses it instead
    of computing it again."""
    g = engine.grammars.tool_calls(TOOLS)
    m = engine.grammars.matcher(g)
    run, ready = engine.grammars.forced_run(m, 100, engine.eos_token_ids)
    assert run and ready is not None  # `<tool_call>\n{"name": "` is forced, the name is not
    fresh = engine.grammars.allocate_bitmask(1)
    llguidance.torch.fill_next_token_bitmask(m, fresh, 0)
    assert torch.equal(ready, fresh)
    _, none = engine.grammars.forced_run(engine.grammars.matcher(g), 1, engine.eos_token_ids)
    assert none is None  # stopped by the limit: no mask of the state after it
