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

__all__ = ["apply_top_p", "raw_logprobs", "sample_rows"]


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax in float32. logits: (B, V) -> (B, V)."""
    return torch.log_softmax(logits.float(), dim=-1)


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

    A temperature of 0 takes the argmax. Rows with a generator draw from it; the
    others share `default_generator` in one batched draw.
    """
    greedy = temperature <= 0  # (B,)
    out = logits.argmax(dim=-1)  # (B,)
    if bool(greedy.all()):
        return out
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    probs = torch.softmax(logits.float() / temp.unsqueeze(-1), dim=-1)  # (B, V)
    probs = apply_top_p(probs, top_p)
    shared = [i for i, g in enumerate(generators) if g is None and not bool(greedy[i])]
    if shared:
        rows = torch.tensor(shared, device=logits.device)
        drawn = torch.multinomial(probs[rows], 1, generator=default_generator).squeeze(-1)
        out[rows] = drawn
    for i, g in enumerate(generators):
        if g is not None and not bool(greedy[i]):
            # Draw on the CPU so a seed gives the same tokens on every device.
            out[i] = torch.multinomial(probs[i].cpu(), 1, generator=g).item()
    return out
