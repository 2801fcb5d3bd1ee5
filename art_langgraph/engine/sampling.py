"""Pure sampling functions over a batch of logits: temperature, top-p, draw, logprobs.

Each function takes rows of logits (one per sequence in the batch) and per-row
parameters, so one call serves a batch that mixes requests with different settings.
Rows that carry a seed draw from their own `torch.Generator`, so a seeded request
gives the same tokens whatever else shares its batch (up to the float noise of a
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


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[torch.Generator | None],
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one token per row. logits: (B, V); temperature, top_p: (B,). Returns (B,) ids.

    A temperature of 0 takes the argmax. Rows with a generator draw their uniform from
    it (on the CPU, so a seed gives the same tokens on every device); the others share
    `default_generator`.
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
    u = torch.empty(len(generators))
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        u[shared] = torch.rand(len(shared), generator=default_generator)
    for i, g in enumerate(generators):
        if g is not None:
            u[i] = torch.rand((), generator=g)
    drawn = inverse_cdf(probs, u.to(probs.device))
    return torch.where(greedy, out, drawn)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token i of each row such that cdf[i-1] <= u * total < cdf[i]. probs: (B, V), u: (B,) in [0, 1)."""
    cdf = probs.cumsum(dim=-1)  # (B, V)
    target = (u * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # (B,)
    return idx.clamp(max=probs.shape[-1] - 1)
