"""Speculative decoding by prompt lookup: greedy rows get the tokens and logprobs of one
step a token in fewer steps, sampled rows keep the model's distribution, and guesses stay
within the grammar, the budget and the seed."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llguidance.torch
import pytest
import torch

from art_langgraph.engine import SamplingParams, TorchEngineConfig
from art_langgraph.engine.request import Request
from art_langgraph.engine.sampling import apply_top_p
from art_langgraph.engine.speculative import NgramIndex, _accept, _Tokens
from art_langgraph.engine.torch_engine import TorchEngine
from art_langgraph.errors import UsageError
from tests.engine.test_constrained import TOOLS


@pytest.fixture(scope="module")
def plain(tiny_path: Path) -> Iterator[TorchEngine]:
    """The tiny model without guesses (fast-forward on, as by default)."""
    eng = TorchEngine.from_pretrained(
        str(tiny_path), TorchEngineConfig(dtype="float32", speculative_tokens=0)
    )
    yield eng
    eng.close_sync()


def _request(prompt: list[int], sampling: SamplingParams) -> Request:
    return Request(prompt, sampling, None, "base", lambda _: None, False)


def test_a_guess_is_what_followed_the_latest_earlier_occurrence() -> None:
    r = _request([1, 2, 3, 9, 8, 1, 2, 3, 4, 1, 2, 3], SamplingParams(max_tokens=9))
    index = NgramIndex(2, 3)
    assert index.guess(_Tokens(r), 4) == [4, 1, 2, 3]  # after the later "1 2 3", not the first
    assert index.guess(_Tokens(r), 2) == [4, 1]
    r.completion.append(4)  # the index grows with the completion, across the prompt's end
    assert index.guess(_Tokens(r), 4) == [1, 2, 3, 4]
    r.completion.append(5)  # "4 5" and "3 4 5" never occurred before
    assert index.guess(_Tokens(r), 4) == []


def test_settings_are_checked() -> None:
    with pytest.raises(UsageError, match="speculative_tokens"):
        TorchEngineConfig(speculative_tokens=-1)
    with pytest.raises(UsageError, match="prompt_lookup_min"):
        TorchEngineConfig(prompt_lookup_min=3, prompt_lookup_max=2)


async def _repeats(engine: TorchEngine, params: SamplingParams, grammar: bool = False) -> list[Any]:
    if grammar:
        params = SamplingParams(**{**vars(params), "grammar": engine.grammars.tool_calls(TOOLS)})
    prompts = [
        engine.tokenizer.encode("one two three four " * (2 + i) + "one two") for i in range(4)
    ]
    free = engine.generate(prompts[0], SamplingParams(max_tokens=9, temperature=0))
    return list(await asyncio.gather(*(engine.generate(p, params) for p in prompts), free))


@pytest.mark.parametrize("grammar", [False, True])
@pytest.mark.parametrize("max_tokens", [40, 7])
async def test_greedy_guesses_give_the_stepwise_tokens_and_logprobs(
    engine: TorchEngine, plain: TorchEngine, grammar: bool, max_tokens: int
) -> None:
    """Rows that guess (beside one that does not) decode what one step a token decodes:
    the same tokens, logprobs and top pairs, within max_tokens and the grammar; with room
    to, in fewer steps. Under a grammar, fast-forward already feeds the forced runs and
    guesses save about one step of nine, less than which step each row happens to join at
    (the worker thread admits rows as they arrive), so there only guesses kept are asserted."""
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, top_logprobs=2)
    steps, kept = engine.steps, engine.lookup.kept
    got = await _repeats(engine, greedy, grammar)
    ran = engine.steps - steps
    steps = plain.steps
    want = await _repeats(plain, greedy, grammar)
    assert plain.lookup.drafted == 0
    for a, b in zip(got, want, strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        for top_a, top_b in zip(a.top_logprobs or [], b.top_logprobs or [], strict=True):
            assert [t for t, _ in top_a] == [t for t, _ in top_b]
    if max_tokens == 40:
        assert engine.lookup.kept > kept
    if max_tokens == 40 and not grammar:
        assert ran < plain.steps - steps
    if grammar:
        text = engine.tokenizer.decode(got[0].completion_token_ids, skip_special_tokens=True)
        assert text.startswith("<tool_call>")


@pytest.mark.parametrize("grammar", [False, True])
async def test_a_seeded_row_draws_what_it_draws_without_guesses(
    engine: TorchEngine, plain: TorchEngine, grammar: bool
) -> None:
    """A seeded sampling row keeps its guesses only as far as its own draws go, each drawn
    with its position's uniform: its tokens are those of an engine that never guesses (in
    a batch of other shapes), again on a second run, and their logprobs a teacher-forced
    forward's."""
    sampled = SamplingParams(max_tokens=40, temperature=1.0, seed=7, ignore_eos=True)
    kept = engine.lookup.kept
    got = await _repeats(engine, sampled, grammar)
    again = await _repeats(engine, sampled, grammar)
    assert engine.lookup.kept > kept
    without = await _repeats(plain, sampled, grammar)
    for x, y, z in zip(got, again, without, strict=True):
        assert x.completion_token_ids == y.completion_token_ids == z.completion_token_ids
    for r in got[:-1]:
        full = torch.tensor([r.prompt_token_ids + r.completion_token_ids])
        with torch.inference_mode():
            logits = engine.base_model(full).logits[0, len(r.prompt_token_ids) - 1 : -1]
        lp = torch.log_softmax(logits.float(), -1)
        want = lp.gather(1, torch.tensor(r.completion_token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(r.logprobs), want, atol=1e-4)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_a_sampled_guess_is_kept_with_its_probability_and_draws_follow_the_model(
    temperature: float, top_p: float
) -> None:
    """Speculative sampling with a one-token draft: the first token is guess t with p(t)
    and otherwise a draw from p without t, so overall it follows p; after a kept guess the
    next follows the next column's p."""
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5], [0.0, 0.5, 1.0, 1.5, -0.5]])
    r = _request([0], SamplingParams(max_tokens=5, temperature=temperature, top_p=top_p))
    gen = torch.Generator().manual_seed(0)
    n = 20_000
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    for _ in range(n):
        kept, drawn = _accept(r, scores.clone(), [1], [], frozenset(), gen)
        first[1 if kept else drawn] += 1
        if kept:
            second[drawn] += 1
    want = apply_top_p(torch.softmax(scores / temperature, -1), torch.full((2,), top_p))
    for t in range(scores.shape[1]):
        assert first[t] / n == pytest.approx(float(want[0, t]), abs=0.015)
        assert second[t] / first[1] == pytest.approx(float(want[1, t]), abs=0.025)


def test_a_walk_keeps_what_the_grammar_allows_and_leaves_the_matcher_as_it_was(
    engine: TorchEngine,
) -> None:
    grammars = engine.grammars
    m = grammars.matcher(grammars.tool_calls(TOOLS))
    before = grammars.allocate_bitmask(1)
    llguidance.torch.fill_next_token_bitmask(m, before, 0)
    opening = engine.tokenizer.encode('<tool_call>\n{"name": "get_')
    kept, masks = grammars.walk(m, [*opening, *engine.tokenizer.encode(" nonsense")], None)
    assert kept == opening and len(masks) == len(kept) + 1
    assert torch.equal(masks[0], before)
    after = grammars.allocate_bitmask(1)
    llguidance.torch.fill_next_token_bitmask(m, after, 0)
    assert torch.equal(after, before) and m.consume_token(opening[0])
