"""The request body of `/v1/chat/completions`, as the OpenAI API defines it, plus vLLM's extras.

Unknown fields are accepted and ignored (clients send fields we do not use, like
`user` or `store`). Validation errors become HTTP 400 in the server.

Left out: audio, images, `functions` (the deprecated form of `tools`), `logit_bias`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ChatCompletionRequest"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    """Send a last chunk with the usage of the whole request."""


class ChatCompletionRequest(BaseModel):
    """Body of POST /v1/chat/completions."""

    model_config = ConfigDict(extra="allow")

    model: str
    """`name` (latest step) or `name@step` (pinned)."""
    messages: list[dict[str, Any]] = Field(min_length=1)
    """OpenAI-format messages."""
    tools: list[dict[str, Any]] | None = None
    """OpenAI function tools: `{"type": "function", "function": {name, description, parameters}}`."""
    tool_choice: str | dict[str, Any] | None = None
    """"none", "auto" (default with tools), "required", or `{"type": "function", "function": {"name": ...}}`."""
    parallel_tool_calls: bool = True
    """Allow several tool calls in one turn (applies to forced calls)."""
    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature; default 1.0; 0 is greedy."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling mass; default 1.0."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most completion tokens (deprecated name of max_completion_tokens)."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """Most completion tokens; default: what the context leaves."""
    n: int = Field(default=1, ge=1, le=128)
    """Completions to sample for the one prompt."""
    stop: str | list[str] | None = None
    """Up to 4 strings that end a completion."""
    seed: int | None = None
    """Seed: the same request with the same seed gives the same completion (choice i uses seed + i)."""
    logprobs: bool = False
    """Return the logprob of each sampled token."""
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    """With logprobs: how many alternatives per position."""
    response_format: dict[str, Any] | None = None
    """{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}."""
    stream: bool = False
    """Answer with server-sent events."""
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    """vLLM extension: add `prompt_token_ids` (top level) and `token_ids` (per choice)."""
    structured_outputs: dict[str, Any] | None = None
    """vLLM extension: constrain the completion with one of `{"json": schema}`, `{"regex": r}`,
    `{"grammar": lark}` (llguidance Lark) or `{"choice": [strings]}`."""
    ignore_eos: bool = False
    """vLLM extension: keep generating past end-of-sequence (benchmarks)."""

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        items = [v] if isinstance(v, str) else v
        if len(items) > 4 or any(not s for s in items):
            raise ValueError("stop takes at most 4 non-empty strings")
        return items

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return None
        kind = v.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError("response_format.type must be 'text', 'json_object' or 'json_schema'")
        if kind == "json_schema":
            js = v.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
                raise ValueError("response_format.json_schema.schema must be an object")
        return v

    @field_validator("structured_outputs")
    @classmethod
    def _structured(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return None
        keys = [k for k in ("json", "regex", "grammar", "choice") if v.get(k) is not None]
        if len(keys) != 1:
            raise ValueError("structured_outputs takes exactly one of json, regex, grammar, choice")
        return v

    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def mode(self) -> Literal["none", "auto", "required", "named"]:
        """How tools are used for this request."""
        if not self.tools:
            return "none"
        tc = self.tool_choice
        if tc is None or tc == "auto":
            return "auto"
        if tc == "none":
            return "none"
        if tc == "required":
            return "required"
        if isinstance(tc, dict):
            return "named"
        raise ValueError(f"tool_choice {tc!r} is not 'none', 'auto', 'required' or a function")
