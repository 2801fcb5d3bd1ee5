"""Fast-forward through forced tokens: a decode step in which rows feed, after their next
token, the tokens their grammar forces, recorded from that step's logits.

Under a grammar (a forced tool call, a JSON schema) most tokens are the only one the
grammar allows: a call's `{"name": "`, the rest of a function name once its prefix is
unique. Sampling such a token draws it with certainty, so a step that only computes it
buys nothing but its KV. After each sampled token the engine reads the run its grammar
forces (`read_ahead`, by `GrammarCompiler.forced_run`) into `Request.forced`; the next
decode step feeds each row's next token and up to `forced_width` of its run, right-aligned
in the step's new columns with masked pads (`step_inputs`), and `record_fed` records every
fed token with its logprob from the column before it, the same logprob a step of its own
would give. A row whose run is used up samples from its last column as any decode does.

The engine's `_decode_forced` (torch_engine.py) runs these around its forward; the switch
is `TorchEngineConfig.fast_forward`. Left out: the forward and the sampling (the
engine's), and guessing tokens no grammar forces (`engine/speculative.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from art_langgraph.engine.request import Request
from art_langgraph.engine.sampling import raw_logprobs, top_pairs


def read_ahead(r: Request, grammars: Any, eos_token_ids: frozenset[int], context: int) -> list[int]:
    """The tokens `r`'s grammar forces next, consumed by its matcher, leaving room for one
    sampled token within its max_tokens and the context (`context` tokens); the mask it
    computed for the state after them goes to `r.ready_mask`. Nothing for a request with
    stop strings: a forced token could complete one, and the step would run past it."""
    s = r.sampling
    if s.stop or r.matcher is None:
        return []
    done = len(r.prompt_ids) + len(r.completion)
    limit = min(s.max_tokens - len(r.completion), context - done) - 1
    refuse = eos_token_ids | frozenset(s.stop_token_ids)
    run, r.ready_mask = grammars.forced_run(r.matcher, limit, refuse)
    return run


def forced_width(runs: list[int], worth: list[float] | None = None) -> int:
    """How many tokens a decode step feeds per row ahead of its next, given each row's run
    (0 for none) and what each of its tokens is worth (`worth`: 1 for a forced token, the
    default; a guess's chance to be kept, `PromptLookup.worth`): the longest run such that
    the step's expected real tokens are at least its padding. Every row gets the step's
    columns, so a width only one row fills would grow the whole batch's KV, and the
    step's positions, by pads; this bounds that growth to the real tokens it carries."""
    best = 0
    b = len(runs)
    w = worth or [1.0] * b
    for k in sorted(set(runs)):
        real = sum(1 + min(n, k) * x for n, x in zip(runs, w, strict=True))
        if 2 * real >= b * (1 + k):
            best = k
    return best


def step_inputs(
    rows: list[Request | None], nxt: list[int], fed: list[int], pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's (B, q) token ids, mask of the new columns, and position offsets: row i's
    next token and its first `fed[i]` forced ones, right-aligned after pads (masked out;
    their offset repeats 0, a real position); a row without a forced run feeds its
    guessed tokens instead (`engine/speculative.py`). q is 1 + the most any row feeds."""
    b, q = len(rows), 1 + max(fed, default=0)
    ids = torch.full((b, q), pad, dtype=torch.long)
    mask = torch.zeros((b, q), dtype=torch.long)
    offsets = torch.zeros((b, q), dtype=torch.long)
    for i, r in enumerate(rows):
        n = 1 + fed[i]
        ids[i, q - n :] = torch.tensor([nxt[i], *((r.forced or r.draft)[: fed[i]] if r else [])])
        mask[i, q - n :] = 1
        offsets[i, q - n :] = torch.arange(n)
    return ids, mask, offsets


def record_fed(
    rows: list[Request | None], logits: torch.Tensor, fed: list[int], nxt: list[int]
) -> tuple[list[int], int]:
    """Record, for each live row, the forced tokens it fed (each with its logprob, and top
    pairs when asked for, from the logits (B, q, V) of the column before it). A row with
    forced tokens left also records the first of them, from its last column, and feeds it
    next (`nxt[i]`, updated in place). Returns the rows that sample their next token from
    their last column (not those whose grammar just ended), and the tokens recorded."""
    q = logits.shape[1]
    to_sample: list[int] = []
    recorded = 0
    for i, r in enumerate(rows):
        if r is None or r.draft:  # a row that fed guesses: `PromptLookup.verify`'s
            continue
        wanted = r.forced[: fed[i] + 1]  # the fed ones, and the one after them if forced
        first = q - 1 - fed[i]  # the column of the row's next token: it predicts forced[0]
        lp = raw_logprobs(logits[i, first : first + len(wanted)])  # (n, V)
        chosen = lp.gather(1, torch.tensor(wanted, device=lp.device).unsqueeze(1)).squeeze(1)
        tops = top_pairs(lp, [r.sampling.top_logprobs] * len(wanted))
        for tok, value, top in zip(wanted, chosen.tolist(), tops, strict=True):
            r.record(tok, value, top, consumed=True)
        recorded += len(wanted)
        r.forced = r.forced[len(wanted) :]
        if len(wanted) > fed[i]:
            nxt[i] = wanted[-1]
        elif not (r.matcher is not None and r.matcher.is_stopped()):
            to_sample.append(i)  # else it ends here: its grammar is done
    return to_sample, recorded
