"""Sampling functions on hand-made distributions."""

from __future__ import annotations

import torch

from art_langgraph.engine.sampling import (
    apply_top_p,
    inverse_cdf,
    position_uniform,
    raw_logprobs,
    sample_rows,
)


def test_top_p_keeps_the_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    out = apply_top_p(probs, torch.tensor([0.7, 1.0]))
    assert torch.allclose(out[0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert torch.allclose(out[1], probs[1])
    # the top token survives even a tiny top_p
    assert torch.allclose(
        apply_top_p(probs[:1], torch.tensor([0.01])), torch.tensor([[1.0, 0, 0, 0]])
    )


def test_greedy_rows_take_the_argmax() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
    ids = sample_rows(logits, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), [None, None])
    assert ids.tolist() == [1, 0]


def test_seeded_rows_repeat_whatever_shares_the_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    temp, top_p = torch.ones(4), torch.full((4,), 0.9)
    seeded = position_uniform(7, 3)

    def draw() -> list[int]:
        uniforms = [seeded, None, None, None]
        return sample_rows(
            logits, temp, top_p, uniforms, torch.Generator().manual_seed(123)
        ).tolist()

    a, b = draw(), draw()
    assert a == b
    # the seeded row does not depend on the other rows
    alone = sample_rows(logits[:1], temp[:1], top_p[:1], [seeded]).tolist()
    assert alone[0] == a[0]


def test_a_positions_uniform_depends_on_the_seed_and_the_position_alone() -> None:
    draws = [position_uniform(seed, pos) for seed in range(50) for pos in range(200)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert len(set(draws)) == len(draws)  # no two (seed, position) pairs share one
    assert position_uniform(7, 3) == position_uniform(7, 3)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.01  # spread over [0, 1)


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    ids = sample_rows(logits, torch.ones(4000), torch.ones(4000), [None] * 4000, gen)
    freq = torch.bincount(ids, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_raw_logprobs_normalise() -> None:
    lp = raw_logprobs(torch.tensor([[1.0, 2.0, 3.0]]))
    assert torch.allclose(lp.exp().sum(), torch.tensor(1.0))


def test_inverse_cdf_never_picks_a_zero_probability_token() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.2, 0.0, 0.8, 0.0]])
    for u in (0.0, 0.25, 0.4999, 0.5, 0.9999):
        ids = inverse_cdf(probs, torch.tensor([u, u]))
        assert probs[0, ids[0]] > 0 and probs[1, ids[1]] > 0
    assert inverse_cdf(probs, torch.tensor([0.0, 0.0])).tolist() == [1, 0]
    assert inverse_cdf(probs, torch.tensor([0.99, 0.99])).tolist() == [3, 2]
