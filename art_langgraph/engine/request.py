"""One request in the torch engine: its record from submission to result, and when it stops.

`Request` is a row of the engine's batch while it runs: its prompt and settings, the
tokens and logprobs sampled so far, its grammar matcher, and its timings.
`kv_width` is what it may come to hold in the KV cache (the engine's admission counts it
against `TorchEngineConfig.max_kv_bytes`), `finish_reason` says whether its last token
ended it, `record` adds a sampled token, and `result` is the `GenerateResult` it ends
with. `to_future` and `to_queue` make the `emit` that hands its tokens and result from the
engine's thread to the caller's event loop.

Left out: the queue and admission (`torch_engine.py`), the batch (`batch.py`), and
sampling the tokens (`TorchEngine._sample`, `engine/sampling.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from art_langgraph.engine.base import GenerateResult, SamplingParams, TokenEvent
from art_langgraph.engine.sampling import position_uniform
from art_langgraph.errors import ContextLengthError, UsageError

log = logging.getLogger(__name__)

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
    matcher: Any = None
    """Its grammar's matcher (`engine/constrained.py`), or None."""
    completion: list[int] = field(default_factory=list)
    """Tokens sampled so far."""
    forced: list[int] = field(default_factory=list)
    """Tokens its grammar forces after its last one, read ahead (`GrammarCompiler.
    forced_run`) and already consumed by its matcher: the engine feeds them with the next
    forward and records them, with their logprobs, from its logits."""
    draft: list[int] = field(default_factory=list)
    """Tokens guessed to follow its last one (`engine/speculative.py`): the engine feeds
    them with the next forward and keeps those the model's draws keep."""
    draft_masks: list[torch.Tensor] = field(default_factory=list)
    """Under a grammar, the packed mask (1, W) of each state along `draft`, and after it."""
    lookup: Any = None
    """Its prompt-lookup index (`speculative.NgramIndex`), made at its first guess."""
    ready_mask: torch.Tensor | None = None
    """Its grammar's packed mask (1, W) for the matcher's state now, where the read-ahead
    computed it: the sampler uses it instead of computing it again. A consumed token
    clears it."""
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
    pinned: list[Any] = field(default_factory=list)
    """The prefix-cache blocks it pinned while it waits (`PrefixCache.pin`), till its
    prefill."""
    t_submit: float = field(default_factory=time.perf_counter)
    """When it was submitted (`time.perf_counter`)."""
    t_start: float = 0.0
    """When it was admitted."""
    t_first: float = 0.0
    """When its first token was sampled."""

    def seeded_uniform(self, ahead: int = 0) -> float | None:
        """Where it carries a seed, the uniform that draws its token `ahead` positions past
        the next one (`sampling.position_uniform`); None: the engine's shared generator draws."""
        seed = self.sampling.seed
        return None if seed is None else position_uniform(seed, len(self.completion) + ahead)

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
        if self.matcher is not None and not self.forced and self.matcher.is_stopped():
            return "stop", None  # (a run read ahead may have stopped it: recorded first)
        if len(self.completion) >= s.max_tokens:
            return "length", None
        if len(self.prompt_ids) + len(self.completion) >= context_length:
            return "length", None
        return None

    def record(
        self,
        token: int,
        logprob: float,
        top: list[tuple[int, float]] | None,
        *,
        consumed: bool = False,
    ) -> None:
        """Add a sampled token: its logprob (and top pairs, when asked for), the grammar's
        step (unless the matcher `consumed` it already: a forced token read ahead), and,
        when streaming, the token to the caller."""
        self.completion.append(token)
        self.logprobs.append(logprob)
        if top is not None:
            self.top = self.top if self.top is not None else []
            self.top.append(top)
        matcher = self.matcher
        if not consumed:
            self.ready_mask = None  # the matcher moves on past it
        if (
            matcher is not None
            and not consumed
            and not matcher.is_stopped()
            and not matcher.consume_token(token)
        ):
            log.warning("grammar rejected token %d: %s", token, matcher.get_error())
        if self.stream:
            self.emit(TokenEvent(token, logprob, top))

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


def checked_prompt(prompt_ids: Any, vocab_size: int, context_length: int) -> list[int]:
    """The prompt as a list of ints, refused (`UsageError`, `ContextLengthError`) when it
    is empty, holds an id outside the vocabulary, or leaves no room in the context."""
    prompt = [int(i) for i in prompt_ids]
    if not prompt:
        raise UsageError("the prompt is empty")
    if max(prompt) >= vocab_size or min(prompt) < 0:
        raise UsageError(f"prompt token ids must be in [0, {vocab_size})")
    if len(prompt) >= context_length:
        raise ContextLengthError(len(prompt), None, context_length)
    return prompt


Emit = Callable[[TokenEvent | GenerateResult | BaseException], None]


def to_future(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any]) -> Callable[[Any], None]:
    """An `emit` that settles `fut` on `loop` with the result or the error (tokens dropped;
    an engine command's `None` settles it too)."""

    def emit(item: Any) -> None:
        if not isinstance(item, TokenEvent):
            _post(loop, _settle, fut, item)

    return emit


def to_queue(loop: asyncio.AbstractEventLoop, q: asyncio.Queue[Any]) -> Emit:
    """An `emit` that puts every token, the result or the error on `q` on `loop`."""

    def emit(item: TokenEvent | GenerateResult | BaseException) -> None:
        _post(loop, q.put_nowait, item)

    return emit


def _settle(fut: asyncio.Future[Any], item: Any) -> None:
    if fut.done():
        return
    if isinstance(item, BaseException):
        fut.set_exception(item)
    else:
        fut.set_result(item)


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Hand `fn(*args)` from the engine's thread to `loop`. A loop already closed (the
    process is stopping: Ctrl-C while a batch was decoding) has nobody left to tell."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise
