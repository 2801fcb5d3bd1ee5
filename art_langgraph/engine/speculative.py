"""Speculative decoding by prompt lookup: rows feed tokens guessed from their own context
and keep the ones the model would have drawn.

Agents repeat themselves: a tool call's arguments copy the user's words, a final answer
copies a tool's result, an untrained model repeats one call until its budget ends. After a
row's token is sampled, `PromptLookup.draft` looks its last n tokens up (n from
`prompt_lookup_max` down to `prompt_lookup_min`) in the row's prompt and completion and
takes the up to `speculative_tokens` tokens that followed their latest earlier
occurrence (vLLM's "ngram" method). The next decode step feeds them after the row's next
token, as fast-forward feeds forced ones (`fast_forward.step_inputs`), and
`PromptLookup.verify` reads the model's distribution at each column:

- a greedy row keeps a guessed token while it is the argmax, then takes the argmax: the
  tokens a step each would give;
- a sampling row draws each column's token as a step of its own would (temperature,
  top-p and grammar as `engine/sampling.py` applies them; a seeded row with the uniform
  of that position, `sampling.position_uniform`) and keeps the guesses up to the first
  that differs, taking that draw: its tokens are the model's own draws, a guess t is kept
  with probability p(t) as in speculative sampling with a draft that puts all its mass on
  t (Leviathan et al. 2023), and a seeded row's tokens are those it draws without guesses;
- every kept token records its logprob from its column's logits, the ones a step of its
  own would use; where all are kept the row draws one more from the last column.

Refused columns are masked out of the batch (their KV stays until
`RunningBatch.squeeze_pads`). Under a grammar the guess stops at the first token the
grammar refuses, and each column samples under its own state's mask
(`GrammarCompiler.walk`). Rows with stop strings guess nothing (a kept token could
complete one mid-step); a guess never holds an end-of-text or stop token, which are
sampled as in any step.

Left out: draft models (EAGLE, Medusa), tree verification, and guessing in a step that
feeds a grammar's forced run.
"""

from __future__ import annotations

import torch

from art_langgraph.engine.batch import RunningBatch
from art_langgraph.engine.constrained import GrammarCompiler, unpack_bitmask
from art_langgraph.engine.request import Request
from art_langgraph.engine.sampling import raw_logprobs, sample_rows, top_pairs
from art_langgraph.engine.torch_config import TorchEngineConfig


class NgramIndex:
    """Where each n-gram (n in [lo, hi]) of a row's tokens last occurred with a token after
    it: the position of that token, grown as the row grows."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.follows: dict[tuple[int, ...], int] = {}
        self.upto = 0
        """Positions whose preceding n-grams are indexed: every e < upto."""
        self.fed = 0
        """The row's guessed tokens fed so far, and of them the ones kept."""
        self.kept = 0

    def guess(self, tokens: _Tokens, k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of the longest suffix
        of `tokens` (at least `lo` long) seen before, or none."""
        end = len(tokens)
        for e in range(max(self.upto, 1), end):  # the n-grams ending before the last token
            window = tokens.span(max(0, e - self.hi), e)
            for n in range(self.lo, min(self.hi, len(window)) + 1):
                self.follows[tuple(window[-n:])] = e
        self.upto = max(self.upto, end)
        tail = tokens.span(max(0, end - self.hi), end)
        for n in range(min(self.hi, len(tail)), self.lo - 1, -1):
            at = self.follows.get(tuple(tail[-n:]))
            if at is not None:
                return tokens.span(at, min(at + k, end))
        return []


class _Tokens:
    """A row's prompt and completion read as one list, without joining them."""

    def __init__(self, r: Request) -> None:
        self.prompt, self.completion = r.prompt_ids, r.completion

    def __len__(self) -> int:
        return len(self.prompt) + len(self.completion)

    def span(self, a: int, b: int) -> list[int]:
        p = len(self.prompt)
        if a >= p:
            return self.completion[a - p : b - p]
        return self.prompt[a:b] + self.completion[: max(0, b - p)]


class PromptLookup:
    """The engine's guesses and their verification (see the module doc)."""

    def __init__(
        self,
        config: TorchEngineConfig,
        grammars: GrammarCompiler,
        eos_token_ids: frozenset[int],
    ) -> None:
        self.tokens = config.speculative_tokens
        self.lo, self.hi = config.prompt_lookup_min, config.prompt_lookup_max
        self.grammars = grammars
        self.eos = eos_token_ids
        self.drafted = 0
        """Guessed tokens fed to the model (for metrics and benchmarks)."""
        self.kept = 0
        """Of them, the ones kept."""

    @staticmethod
    def worth(rows: list[Request | None]) -> list[float]:
        """What one fed token of each row is expected to yield (`fast_forward.forced_width`):
        a guessed one, the share of its row's guesses kept so far (a half before any); any
        other, 1."""
        return [
            (r.lookup.kept + 1) / (r.lookup.fed + 2) if r is not None and r.draft else 1.0
            for r in rows
        ]

    def draft(self, r: Request, context: int) -> None:
        """Set `r.draft` (and, under a grammar, `r.draft_masks`) for its next step, within
        its max_tokens and the model's `context`, with room for one drawn token."""
        r.draft, r.draft_masks = [], []
        s = r.sampling
        if self.tokens <= 0 or s.stop:
            return
        done = len(r.prompt_ids) + len(r.completion)
        limit = min(self.tokens + 1, s.max_tokens - len(r.completion), context - done) - 1
        if limit <= 0:
            return
        if r.lookup is None:
            r.lookup = NgramIndex(self.lo, self.hi)
        guess = r.lookup.guess(_Tokens(r), limit)
        refuse = self.eos | frozenset(s.stop_token_ids)
        guess = guess[: next((j for j, t in enumerate(guess) if t in refuse), len(guess))]
        if guess and r.matcher is not None:
            guess, r.draft_masks = self.grammars.walk(r.matcher, guess, r.ready_mask)
        r.draft = guess

    def verify(
        self,
        batch: RunningBatch,
        logits: torch.Tensor,
        fed: list[int],
        nxt: list[int],
        generator: torch.Generator,
    ) -> tuple[list[int], int]:
        """For each row of `batch` that fed a guess (`fed[i]` of its tokens, right-aligned in
        the step's columns of `logits` (B, q, V)), keep what the model's draws keep, record
        those tokens and the one drawn after them (`nxt[i]`, updated in place; none after a
        grammar that ended), and mask out the columns of the tokens it refused. Returns the
        positions each row moved on (1 + what it fed, less what it refused) and the tokens
        recorded."""
        assert batch.mask is not None
        q = logits.shape[1]
        moved = [1 + f for f in fed]
        recorded = 0
        for i, r in enumerate(batch.rows):
            if r is None or not r.draft:
                continue
            f = fed[i]
            guess, masks = r.draft[:f], r.draft_masks[: f + 1]
            r.draft, r.draft_masks = [], []
            cols = logits[i, q - 1 - f :].float()  # (f + 1, V): column j predicts guess[j]
            lp = raw_logprobs(cols)
            kept, drawn = _accept(r, cols.clone(), guess, masks, self.eos, generator)
            tops = top_pairs(lp[: kept + 1], [r.sampling.top_logprobs] * (kept + 1))
            for j in range(kept):
                r.record(guess[j], float(lp[j, guess[j]]), tops[j])
            ended = r.matcher is not None and r.matcher.is_stopped()
            if not ended:
                r.record(drawn, float(lp[kept, drawn]), tops[kept])
            recorded += kept + (not ended)
            nxt[i] = guess[kept - 1] if ended else drawn
            self.drafted += f
            self.kept += kept
            r.lookup.fed += f
            r.lookup.kept += kept
            if f > kept:  # the refused guesses' columns: their KV stays till squeeze_pads
                batch.mask[i, kept - f :] = 0
                moved[i] = 1 + kept
        return moved, recorded


def _accept(
    r: Request,
    scores: torch.Tensor,
    guess: list[int],
    masks: list[torch.Tensor],
    eos: frozenset[int],
    generator: torch.Generator,
) -> tuple[int, int]:
    """How many of `guess` row `r` keeps, and the token it draws after them, from its
    columns' logits (f + 1, V), changed in place: end-of-text and the grammar's refusals
    masked as `TorchEngine._sample` masks them."""
    s = r.sampling
    if s.ignore_eos:
        scores[:, sorted(eos)] = float("-inf")
    if masks:
        allowed = unpack_bitmask(torch.cat(masks), scores.shape[-1]).to(scores.device)
        scores.masked_fill_(~allowed, float("-inf"))
    n = len(scores)  # each column draws as a step of its own would, with its position's uniform
    draws = sample_rows(
        scores,
        torch.full((n,), s.temperature, device=scores.device),
        torch.full((n,), s.top_p, device=scores.device),
        [r.seeded_uniform(j) for j in range(n)],
        generator,
    ).tolist()
    kept = 0
    while kept < len(guess) and draws[kept] == guess[kept]:
        kept += 1
    return kept, draws[kept]
