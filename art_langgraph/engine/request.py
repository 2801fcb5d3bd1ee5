"""One request in the torch engine: its record from submission to result, and when it stops.

`Request` is a row of the engine's batch while it runs: its prompt and settings, the
tokens and logprobs sampled so far, its grammar matcher and generator, and its timings.
`kv_width` is what it may come to hold in the KV cache (the engine's admission counts it
against `TorchEngineConfig.max_kv_bytes`), `finish_reason` says whether its last token
ended it, and `result` is the `GenerateResult` it ends with.

Left out: the queue, admission and the batch (`torch_engine.py`), and sampling the
tokens (`TorchEngine._sample`, `engine/sampling.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from art_langgraph.engine.base import GenerateResult, SamplingParams, TokenEvent

_KV_GROWTH = 512
"""Most tokens a row is counted to grow by in the KV budget (its max_tokens, when smaller)."""


@dataclass
class Request:
    """A request submitted to the torch engine (a row of its batch once admitted)."""

    prompt_ids: list[int]
    """The prompt's token ids."""
    sampling: SamplingParams
    """Its sampling settings."""
    adapter_name: str | None
    """The adapter asked for by name; None: the base model."""
    adapter_key: str
    """That adapter's peft key (`adapter_slots.BASE_KEY` for the base model)."""
    emit: Callable[[TokenEvent | GenerateResult | BaseException], None]
    """Hands a token, the result or an error to the caller's event loop."""
    stream: bool
    """Whether each token is emitted as it is sampled (else only the result)."""
    generator: torch.Generator | None = None
    """The request's own generator when it carries a seed."""
    matcher: Any = None
    """Its grammar's matcher (`engine/constrained.py`), or None."""
    completion: list[int] = field(default_factory=list)
    """Tokens sampled so far."""
    logprobs: list[float] = field(default_factory=list)
    """The logprob of each sampled token."""
    top: list[list[tuple[int, float]]] | None = None
    """Per sampled token, the most likely (id, logprob) pairs, when asked for."""
    cancelled: bool = False
    """Set when the caller stops waiting: dropped if queued, ended with "abort" if running."""
    identity: str = ""
    """The weights identity the KV was computed under (prefix-cache key), set at admission."""
    cached: int = 0
    """Prompt tokens served from the prefix cache."""
    t_submit: float = field(default_factory=time.perf_counter)
    """When it was submitted (`time.perf_counter`)."""
    t_start: float = 0.0
    """When it was admitted."""
    t_first: float = 0.0
    """When its first token was sampled."""

    def kv_width(self) -> int:
        """The most tokens of KV this row can come to hold: its prompt and completion so
        far, and what it may still sample (at most `_KV_GROWTH` counted)."""
        done = len(self.prompt_ids) + len(self.completion)
        left = (self.sampling.max_tokens or _KV_GROWTH) - len(self.completion)
        return done + max(0, min(left, _KV_GROWTH))

    def finish_reason(
        self, eos_token_ids: frozenset[int], tokenizer: Any, context_length: int
    ) -> tuple[str, str | int | None] | None:
        """(finish reason, stop reason) when the last token sampled ends the request, else None."""
        if self.cancelled:
            return "abort", None
        tok = self.completion[-1]
        s = self.sampling
        if not s.ignore_eos and tok in eos_token_ids:
            return "stop", tok
        if tok in s.stop_token_ids:
            return "stop", tok
        if s.stop:
            longest = max(len(x) for x in s.stop)
            tail = tokenizer.decode(self.completion[-(longest + 4) :], skip_special_tokens=True)
            for x in s.stop:
                if x in tail:
                    return "stop", x
        if self.matcher is not None and self.matcher.is_stopped():
            return "stop", None
        if len(self.completion) >= s.max_tokens:
            return "length", None
        if len(self.prompt_ids) + len(self.completion) >= context_length:
            return "length", None
        return None

    def result(self, reason: str, stop: str | int | None = None) -> GenerateResult:
        """What the request ends with: its tokens, logprobs and timings so far."""
        now = time.perf_counter()
        return GenerateResult(
            prompt_token_ids=self.prompt_ids,
            completion_token_ids=list(self.completion),
            logprobs=list(self.logprobs),
            finish_reason=reason,  # type: ignore[arg-type]
            stop_reason=stop,
            top_logprobs=self.top,
            adapter=self.adapter_name,
            cached_tokens=self.cached,
            timings={
                "queued_s": max(0.0, self.t_start - self.t_submit),
                "prefill_s": max(0.0, self.t_first - self.t_start),
                "decode_s": max(0.0, now - self.t_first),
            },
        )
