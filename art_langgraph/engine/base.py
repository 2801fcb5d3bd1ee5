"""The inference engine contract: token ids in, token ids out.

An `InferenceEngine` takes prompt token ids and `SamplingParams` and returns the
completion token ids with the log-probability of each sampled token and a finish
reason. It also serves LoRA adapters by name. Chat templates, tool-call parsing and
HTTP live at the edges (`chat/format.py`, `serving/app.py`), never here.

Log-probabilities are those of the model's raw distribution (temperature 1, before
top-p and before any grammar mask), as vLLM reports them by default: that is what a
trainer recomputes, so the importance ratio compares like with like.

Beside serving, an engine tells a backend what it must know to train beside it
(`EngineTraits`: the weights' dtype, the largest LoRA rank it loads, the base weights a
trainer in the same process may share) and takes one hook, `reset_prefix_cache`, before
a training step replaces the weights its cached KV was computed under.

Left out: the implementations (`torch_engine.py`, `vllm_engine.py`; R engines behind one
router: `scaleout/replicas.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from art_langgraph.errors import UsageError

if TYPE_CHECKING:
    from art_langgraph.engine.constrained import GrammarCompiler

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    max_tokens: int = 256
    """Most tokens to generate (>= 1). The server clamps it to the context that is left."""
    temperature: float = 1.0
    """Softmax temperature, >= 0. 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to top_p, in (0, 1]."""
    stop: tuple[str, ...] = ()
    """Strings that end the completion when they appear in its text (kept in the token ids, cut from the text)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the completion besides the model's end-of-sequence ids (kept in the ids)."""
    ignore_eos: bool = False
    """Keep going past end-of-sequence tokens until max_tokens (for benchmarks)."""
    seed: int | None = None
    """Seed for this request's sampler; None draws from the engine's generator."""
    top_logprobs: int = 0
    """How many most-likely alternatives to report at each position (0-20)."""
    grammar: str | None = None
    """An llguidance grammar (from `engine.constrained`) the completion must match; None for free text."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UsageError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise UsageError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_logprobs <= 20:
            raise UsageError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")


@dataclass
class TokenEvent:
    """One sampled token, as streamed."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] | None = None
    """(token id, logprob) of the most likely alternatives, when asked for."""


@dataclass
class GenerateResult:
    """One finished completion."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each completion token under the raw model distribution."""
    finish_reason: FinishReason
    stop_reason: str | int | None = None
    """The stop string or token id that ended the completion, if any."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    adapter: str | None = None
    """The adapter that served it (None: the base model)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent queued, in prefill and in decode."""
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the engine's prefix cache instead of a prefill
    (OpenAI's `usage.prompt_tokens_details.cached_tokens`)."""


@dataclass
class EngineMetrics:
    """Counters and gauges an engine reports for `/metrics` (Prometheus text, as vLLM's).

    Counters only grow over the engine's life; a scraper takes rates from them."""

    prompt_tokens: int = 0
    """Counter: prompt tokens of admitted requests (served from the cache or computed)."""
    generation_tokens: int = 0
    """Counter: completion tokens sampled."""
    prefix_cache_queries: int = 0
    """Counter: prompt tokens looked up in the prefix cache."""
    prefix_cache_hits: int = 0
    """Counter: prompt tokens served from the prefix cache."""
    prefix_cache_evictions: int = 0
    """Counter: cache blocks evicted to stay within the budget (or dropped with a stale adapter)."""
    prefix_cache_bytes: int = 0
    """Gauge: bytes of KV held by the prefix cache now."""
    prefix_cache_capacity_bytes: int = 0
    """Gauge: the prefix cache's budget in bytes (0: the cache is off)."""
    running: int = 0
    """Gauge: sequences being decoded now."""
    waiting: int = 0
    """Gauge: requests queued, not yet admitted."""


@dataclass(frozen=True)
class EngineTraits:
    """What a backend training beside an engine needs to know about it."""

    weights_dtype: str | None = None
    """The dtype the engine samples in ("float32", "bfloat16"), which an `auto` trainer
    takes so that it computes in the sampler's precision; None: the engine does not say."""
    max_lora_rank: int | None = None
    """The largest LoRA rank the engine loads (vLLM's `--max-lora-rank`); None: any."""
    shared_base: Any = None
    """The frozen base weights (`engine/shared_base.py::SharedBase`) a trainer in this
    process may wrap instead of loading its own copy; None for an engine in another process."""


@runtime_checkable
class InferenceEngine(Protocol):
    """What the server and a backend need from an engine."""

    context_length: int
    """Most tokens (prompt + completion) one sequence may hold."""
    tokenizer: Any
    """The HF tokenizer whose ids the engine speaks (chat templates are applied outside)."""
    vocab_size: int
    """The model's vocabulary: every token id is below it."""
    grammars: GrammarCompiler
    """Compiles constraints (JSON schemas, forced tool calls) into grammars for `SamplingParams`."""

    @property
    def traits(self) -> EngineTraits:
        """What a backend training beside this engine needs to know about it."""
        ...

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> GenerateResult:
        """Generate one completion; concurrent calls are batched by the engine."""
        ...

    def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[TokenEvent | GenerateResult]:
        """Yield each token as it is sampled, then the GenerateResult."""
        ...

    async def load_adapter(self, name: str, path: str) -> None:
        """Load (or replace) the LoRA adapter `name` from a peft folder."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Drop the adapter `name`; requests for it fail afterwards."""
        ...

    def list_adapters(self) -> list[str]:
        """Names of the adapters loaded now."""
        ...

    def metrics(self) -> EngineMetrics:
        """The engine's counters and gauges now (cheap; called on every `/metrics` scrape)."""
        ...

    async def reset_prefix_cache(self) -> None:
        """Drop the KV kept between requests: a training step that pauses serving is about to
        replace the weights it was computed under, and its memory is the trainer's meanwhile.
        An engine whose cache lives elsewhere (another process) may do nothing: cached KV is
        keyed by the weights it was computed under, so it is never served for new ones."""
        ...

    async def close(self) -> None:
        """Stop the engine; pending requests end with finish_reason 'abort'."""
        ...

    def close_sync(self) -> None:
        """`close` from any thread, with no event loop (a backend closing at interpreter exit):
        returns once the engine's threads and processes are stopped. Idempotent."""
        ...
