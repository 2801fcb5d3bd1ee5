"""`LangfuseConfig`: which Langfuse to talk to and the limits of an export (extra `langfuse`).

One config for every module of the package: the exporter, the re-send, the review
queues, score import and dataset runs all resolve it the same way, unset fields from
Langfuse's own environment variables (`resolved()`).

Left out: talking to Langfuse (sender.py); anything the Langfuse SDK's own `Langfuse`
client reads from the environment beyond the keys, URL and environment name.
"""

from __future__ import annotations

import math
import os

from pydantic import BaseModel, ConfigDict, model_validator

EXTRA_MISSING = (
    "the Langfuse integration needs the langfuse extra: pip install 'art-langgraph[langfuse]'"
)
"""The ImportError message of every module here that needs the Langfuse SDK."""


class LangfuseConfig(BaseModel):
    """Where and how to send traces. Unset fields come from Langfuse's own environment variables."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    public_key: str | None = None
    """Project public key; default `$LANGFUSE_PUBLIC_KEY`."""
    secret_key: str | None = None
    """Project secret key; default `$LANGFUSE_SECRET_KEY`."""
    base_url: str | None = None
    """Langfuse URL; default `$LANGFUSE_BASE_URL`, then `$LANGFUSE_HOST`, then https://cloud.langfuse.com."""
    environment: str | None = None
    """Langfuse environment of the traces; default `$LANGFUSE_TRACING_ENVIRONMENT` (Langfuse's "default" when unset)."""
    timeout_s: float = 10.0
    """Per-request timeout of an export or an API call."""
    flush_timeout_s: float = 30.0
    """How long `close()` waits for queued exports before giving up (they stay re-sendable)."""
    max_queued_batches: int = 1024
    """Batches waiting for the export thread; beyond this a batch is not sent (re-send it later)."""
    max_field_chars: int = 100_000
    """Inputs and outputs longer than this (as JSON) are cut, with a note, to keep spans under the server's limits."""
    max_request_bytes: int = 2_000_000
    """Spans per OTLP request, in encoded bytes before gzip (whole trajectories; one larger trajectory goes alone)."""
    reward_range: tuple[float, float] | None = None
    """(min, max) of the rewards this model gets, finite, min < max: the range of the `reward` and `independent_reward` score configs, so Langfuse shows them on that scale and rejects a score outside it (that batch is then recorded as not sent). Include RULER's [0, 1] when RULER judges. None: unknown, the configs have no bounds (a custom reward may be negative or above 1). A config of that name already in the project whose range does not contain this one is a `ScoreConfigClashError`; one that contains it (an unbounded one made earlier) is reused as is."""

    @model_validator(mode="after")
    def _check_reward_range(self) -> LangfuseConfig:
        r = self.reward_range
        if r is not None and not (math.isfinite(r[0]) and math.isfinite(r[1]) and r[0] < r[1]):
            raise ValueError(
                f"LangfuseConfig.reward_range must be (min, max) with finite min < max; got "
                f"{r!r}. Give the reward function's range, e.g. (0.0, 1.0), or None when it "
                "is unknown"
            )
        return self

    def resolved(self) -> LangfuseConfig:
        """A copy with every unset field filled from the environment (the URL without a
        trailing slash)."""
        env = os.environ.get
        return self.model_copy(
            update={
                "public_key": self.public_key or env("LANGFUSE_PUBLIC_KEY"),
                "secret_key": self.secret_key or env("LANGFUSE_SECRET_KEY"),
                "base_url": (
                    self.base_url
                    or env("LANGFUSE_BASE_URL")
                    or env("LANGFUSE_HOST")
                    or "https://cloud.langfuse.com"
                ).rstrip("/"),
                "environment": self.environment or env("LANGFUSE_TRACING_ENVIRONMENT"),
            }
        )
