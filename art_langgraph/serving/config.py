"""Limits and timeouts of the OpenAI-compatible server (`ServerConfig`).

Every bound here keeps one client from taking the server from the others: the body
size and JSON depth are checked before anything is parsed further, `n x max_tokens`
before anything is queued, and a request's choices decode at most
`max_parallel_choices` at a time, so a later request always finds a batch slot.

Left out: per-key rate limits and quotas (a gateway's job).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServerConfig(BaseModel):
    """Limits and timeouts of the OpenAI-compatible server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description=(
            "Largest request body, in bytes; a larger one gets 413 before it is read. Default "
            "4 MiB: about 1M tokens of text."
        ),
    )
    max_json_depth: int = Field(
        64, ge=4, description="Deepest nesting of JSON objects and arrays in a request body."
    )
    default_max_tokens: int = Field(
        1024,
        ge=1,
        description=(
            "Completion tokens when a request names no max_tokens (and the context allows). "
            "vLLM's default is the rest of the context, which lets one forgotten field hold a "
            "batch slot for minutes on a CPU."
        ),
    )
    max_request_tokens: int = Field(
        32768,
        ge=1,
        description="Most completion tokens one request may ask for in all: n x max_tokens.",
    )
    max_parallel_choices: int = Field(
        16,
        ge=1,
        description=(
            "Most choices of one request decoding at once; the rest of its n wait for these. "
            "Keeps a fair share of batch slots for other requests."
        ),
    )
    keep_alive_s: float = Field(
        30.0,
        gt=0,
        description=(
            "Idle keep-alive of a connection, in seconds. Longer than the openai client's 5 s, "
            "so the client always closes first and never reuses a connection being closed."
        ),
    )
    graceful_shutdown_s: float = Field(
        3.0,
        ge=0,
        description=(
            "On SIGTERM or stop(): how long running requests may finish before they are "
            "cancelled (their batch slots are freed) and the server exits."
        ),
    )
