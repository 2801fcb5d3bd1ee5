"""Pure sampling functions over a batch of logits: temperature, top-p, draw, logprobs.

Each function takes rows of logits (one per sequence in the batch) and per-row
parameters, so one call serves a batch that mixes requests with different settings.
Rows that carry a seed draw the token at each position with a uniform made from the seed
and the position (`position_uniform`), so a seeded request gives the same tokens whatever
else shares its batch and however its steps fed tokens ahead (up to the float noise of a
different batch shape).

Left out: repetition/presence penalties and min-p (not asked for yet).
"""

from __future__ import annotations

import torch


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax in float32. logits: (B, V) -> (B, V)."""
    return torch.log_softmax(logits.float(), dim=-1)


def top_pairs(lp: torch.Tensor, counts: list[int]) -> list[list[tuple[int, float]] | None]:
    """Per row of logprobs (B, V), its `counts[i]` most likely (id, logprob) pairs, or None
    where it asks for none (the OpenAI API's `top_logprobs`)."""
    k = max(counts, default=0)
    if not k:
        return [None] * len(counts)
    values, ids = (t.cpu() for t in lp.topk(k, dim=-1))
    return [
        list(zip(ids[i, :n].tolist(), values[i, :n].tolist(), strict=True)) if n else None
        for i, n in enumerate(counts)
    ]


def apply_top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero out the tail of each row beyond its nucleus and renormalise.

    probs: (B, V), rows sum to 1; top_p: (B,) in (0, 1]. Returns (B, V).
    The most likely token is always kept.
    """
    if bool((top_p >= 1).all()):
        return probs
    sorted_p, idx = probs.sort(dim=-1, descending=True)  # (B, V)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token, (B, V)
    keep_sorted = before < top_p.unsqueeze(-1)  # (B, V)
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    out = probs * keep
    return out / out.sum(dim=-1, keepdim=True)


_MASK64 = (1 << 64) - 1


def position_uniform(seed: int, position: int) -> float:
    """The uniform in [0, 1) that draws the token at `position` of a seeded request's
    completion: a function of the two alone (splitmix64), so the token a seed draws does not
    depend on what else its batch holds, nor on how many tokens a step fed (forced runs,
    speculative guesses), nor on the device."""
    x = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xD1B54A32D192ED03) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((x ^ (x >> 31)) >> 11) * 2.0**-53


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: list[float | None],
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one token per row. logits: (B, V); temperature, top_p: (B,). Returns (B,) ids.

    A temperature of 0 takes the argmax. Rows given a uniform (a seeded request's,
    `position_uniform`) draw with it; the others share `default_generator`.
    """
    greedy = temperature <= 0  # (B,)
    out = logits.argmax(dim=-1)  # (B,)
    if bool(greedy.all()):
        return out
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    probs = torch.softmax(logits.float() / temp.unsqueeze(-1), dim=-1)  # (B, V)
    probs = apply_top_p(probs, top_p)
    # Inverse-CDF draw: one uniform per row (multinomial draws one per vocabulary entry,
    # which costs ~100 ms a step at a 150k vocabulary on a CPU).
    u = torch.tensor([0.0 if x is None else x for x in uniforms])
    shared = [i for i, x in enumerate(uniforms) if x is None]
    if shared:
        u[shared] = torch.rand(len(shared), generator=default_generator)
    drawn = inverse_cdf(probs, u.to(probs.device))
    return torch.where(greedy, out, drawn)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token i of each row such that cdf[i-1] <= u * total < cdf[i]. probs: (B, V), u: (B,) in [0, 1)."""
    cdf = probs.cumsum(dim=-1)  # (B, V)
    target = (u * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # (B,)
    return idx.clamp(max=probs.shape[-1] - 1)
