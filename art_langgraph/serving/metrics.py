"""`GET /metrics`: the server's counters and gauges in Prometheus text format, as vLLM's.

The body is the text exposition format 0.0.4 (content type `CONTENT_TYPE`, what
prometheus_client serves): per family a `# HELP` line, a `# TYPE` line and one sample
`name{model_name="..."} value`, the label naming the base model the engine serves (vLLM
labels its samples so too). Names carry the `art:` prefix where vLLM's carry `vllm:`:

    art:prompt_tokens_total                  counter  prompt tokens of admitted requests
    art:generation_tokens_total              counter  completion tokens sampled
    art:prefix_cache_queries_total           counter  prompt tokens looked up in the prefix cache
    art:prefix_cache_hits_total              counter  prompt tokens served from it
    art:prefix_cache_hit_rate                gauge    hits / queries since start (0 before any)
    art:prefix_cache_evictions_total         counter  cache blocks evicted
    art:prefix_cache_usage_bytes             gauge    bytes of KV the cache holds now
    art:prefix_cache_capacity_bytes          gauge    its budget (0: the cache is off)
    art:num_requests_running                 gauge    sequences being decoded now
    art:num_requests_waiting                 gauge    requests queued, not yet admitted
    art:avg_prompt_throughput_toks_per_s     gauge    prompt tokens/s over the last 10 s
    art:avg_generation_throughput_toks_per_s gauge    generation tokens/s over the last 10 s

The engine reports the counters and gauges (`InferenceEngine.metrics()`, `EngineMetrics`);
this module derives the rest. The two throughputs (vLLM's older gauges of the same names)
are the counters' growth over the last `WINDOW_S` seconds: from the first scrape on, a
task on the server's event loop samples the counters every `TICK_S`, so a server that
nobody scrapes does no work, and until a window has passed the rate covers the time since
the first scrape. The hit rate is over the engine's life: a scraper takes a recent one as
`rate(hits) / rate(queries)`.

Auth as for `/v1/models`: with an API key, a scraper sends `Authorization: Bearer <key>`
(Prometheus: `authorization: {credentials: <key>}` in the scrape config).

Left out: vLLM's histograms (time to first token, inter-token latency, end-to-end
latency), the `_created` samples of counters, and OpenMetrics.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from art_langgraph.engine.base import EngineMetrics, InferenceEngine

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format's content type, as prometheus_client (and so vLLM) sends it."""
PREFIX = "art:"
"""Every metric name starts with it (vLLM's are `vllm:...`)."""
WINDOW_S = 10.0
"""Seconds over which the throughput gauges are measured (vLLM logs over 10 s too)."""
TICK_S = 1.0
"""Seconds between two samples of the counters, once the first scrape started the sampler."""


@dataclass(frozen=True)
class Throughput:
    """Tokens per second over the recent window."""

    prompt: float
    """Prompt tokens admitted per second."""
    generation: float
    """Completion tokens sampled per second."""


class TokenRates:
    """Prompt and generation tokens per second over the last `window_s`, from samples of
    the two counters taken about `tick_s` apart."""

    def __init__(self, window_s: float = WINDOW_S, tick_s: float = TICK_S) -> None:
        self.window_s, self.tick_s = window_s, tick_s
        # (time s, prompt tokens, generation tokens), oldest first; the oldest is the newest
        # sample at least window_s old, when there is one.
        self._samples: deque[tuple[float, int, int]] = deque()

    def observe(self, now: float, prompt: int, generation: int) -> None:
        """Keep a sample of the counters at `now` (dropped if the last is under a half tick old)."""
        s = self._samples
        if s and now - s[-1][0] < self.tick_s / 2:
            return
        s.append((now, prompt, generation))
        while len(s) > 1 and s[1][0] <= now - self.window_s:
            s.popleft()

    def rates(self, now: float, prompt: int, generation: int) -> Throughput:
        """The counters' growth per second since the window's start (or the first sample, if
        younger), given their values now; 0 with no earlier sample."""
        if not self._samples:
            return Throughput(0.0, 0.0)
        t0, prompt0, generation0 = self._samples[0]
        span = now - t0
        if span <= 0:
            return Throughput(0.0, 0.0)
        return Throughput(
            max(0.0, (prompt - prompt0) / span), max(0.0, (generation - generation0) / span)
        )


@dataclass(frozen=True)
class _Family:
    """One metric: its name (without `PREFIX`), type, help line, and how to read its value."""

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    value: Callable[[EngineMetrics, Throughput], float]


def _hit_rate(m: EngineMetrics) -> float:
    return m.prefix_cache_hits / m.prefix_cache_queries if m.prefix_cache_queries else 0.0


_FAMILIES: tuple[_Family, ...] = (
    _Family("prompt_tokens_total", "counter", "Prompt tokens of admitted requests (served from the prefix cache or computed).", lambda m, r: m.prompt_tokens),
    _Family("generation_tokens_total", "counter", "Completion tokens sampled.", lambda m, r: m.generation_tokens),
    _Family("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", lambda m, r: m.prefix_cache_queries),
    _Family("prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.", lambda m, r: m.prefix_cache_hits),
    _Family("prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries since the engine started (0 before any query).", lambda m, r: _hit_rate(m)),
    _Family("prefix_cache_evictions_total", "counter", "Prefix cache blocks evicted to stay within the budget (or dropped with a stale adapter).", lambda m, r: m.prefix_cache_evictions),
    _Family("prefix_cache_usage_bytes", "gauge", "Bytes of KV held by the prefix cache now.", lambda m, r: m.prefix_cache_bytes),
    _Family("prefix_cache_capacity_bytes", "gauge", "The prefix cache's budget in bytes (0: the cache is off).", lambda m, r: m.prefix_cache_capacity_bytes),
    _Family("num_requests_running", "gauge", "Sequences being decoded now.", lambda m, r: m.running),
    _Family("num_requests_waiting", "gauge", "Requests queued, not yet admitted.", lambda m, r: m.waiting),
    _Family("avg_prompt_throughput_toks_per_s", "gauge", f"Prompt tokens per second over the last {WINDOW_S:g} s.", lambda m, r: r.prompt),
    _Family("avg_generation_throughput_toks_per_s", "gauge", f"Generation tokens per second over the last {WINDOW_S:g} s.", lambda m, r: r.generation),
)  # fmt: skip


class ServerMetrics:
    """The `/metrics` body of one engine's server; call `render()` on its event loop."""

    def __init__(self, engine: InferenceEngine, model_name: str) -> None:
        self.engine = engine
        self.labels = f'model_name="{_escape_label(model_name)}"'
        self.throughput = TokenRates()
        self._sampler: asyncio.Task[None] | None = None

    def render(self) -> str:
        """The exposition text now; starts the sampler on the first call."""
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.get_running_loop().create_task(self._sample_forever())
        m = self.engine.metrics()
        self._observe(m)
        rates = self.throughput.rates(time.monotonic(), m.prompt_tokens, m.generation_tokens)
        lines: list[str] = []
        for f in _FAMILIES:
            name = PREFIX + f.name
            lines += [
                f"# HELP {name} {_escape_help(f.help)}",
                f"# TYPE {name} {f.kind}",
                f"{name}{{{self.labels}}} {_number(f.value(m, rates))}",
            ]
        return "\n".join(lines) + "\n"

    def _observe(self, m: EngineMetrics) -> None:
        self.throughput.observe(time.monotonic(), m.prompt_tokens, m.generation_tokens)

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self._observe(self.engine.metrics())
            except Exception:  # the next scrape reports the failure; the sampler goes on
                log.debug("reading the engine's metrics failed", exc_info=True)


def _number(v: float) -> str:
    """A sample value as the format writes it: integers plain, NaN and infinities by name."""
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
