"""The wire format of `/v1/chat/completions`, as the OpenAI API defines it, plus vLLM's extras.

Requests: unknown fields are accepted and ignored (clients send fields we do not use,
like `user` or `store`); validation errors become HTTP 400 in the server.

Responses (`ChatCompletion`, `ChatCompletionChunk`): typed; an extra field (vLLM's
`token_ids`, `prompt_token_ids`, a delta's parts) is left out of the JSON when it is None,
while OpenAI's own fields are always there (`logprobs: null`, as OpenAI sends). `Usage`
carries `prompt_tokens_details.cached_tokens` as OpenAI does (vLLM sends it only when
asked; here it is always there, 0 when nothing came from the prefix cache).

Left out: audio, images, `functions` (the deprecated form of `tools`), `logit_bias`.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    """Send a last chunk with the usage of the whole request."""


class FunctionCall(BaseModel):
    """An assistant message's call: the function's name and its JSON arguments."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=256)
    arguments: str | dict[str, Any] = "{}"
    """A JSON string (OpenAI's form); an object is accepted and serialized."""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    """A part of a message's content; only text parts are rendered."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One OpenAI-format message."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """Assistant messages only: the calls it made."""
    tool_call_id: str | None = None
    """Tool messages only: the call this result answers."""


class FunctionSpec(BaseModel):
    """A function tool: its name, description and JSON Schema parameters."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON Schema object (checked against the JSON Schema meta-schema)."""
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            _check_json_schema(v)
        return v


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedFunction(BaseModel):
    name: str = Field(min_length=1, max_length=256)


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: call this tool."""

    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedTools(BaseModel):
    mode: Literal["auto", "required"]
    """"required": call one or more of `tools` ("auto", text or a call, is refused)."""
    tools: list[NamedToolChoice] = Field(min_length=1)
    """The tools that may be called, by name: a subset of the request's `tools`."""


class AllowedToolsChoice(BaseModel):
    """OpenAI's `{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`: call only
    these of the request's tools, while the prompt still shows them all, so it stays the
    prefix it was at the previous turn (an agent that forbids a tool for one turn keeps
    its prefix cache, and its trajectory one sequence)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


def _check_json_schema(schema: dict[str, Any]) -> None:
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ValueError(f"not a valid JSON Schema at {where}: {exc.message[:200]}") from None


_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1  # what torch.manual_seed accepts


class ChatCompletionRequest(BaseModel):
    """Body of POST /v1/chat/completions."""

    model_config = ConfigDict(extra="allow")

    model: str
    """`name` (latest step) or `name@step` (pinned)."""
    messages: list[ChatMessage] = Field(min_length=1)
    """OpenAI-format messages."""
    tools: list[Tool] | None = None
    """OpenAI function tools: `{"type": "function", "function": {name, description, parameters}}`."""
    tool_choice: (
        Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None
    ) = None
    """"none", "auto" (default with tools), "required", `{"type": "function", "function":
    {"name": ...}}`, or `{"type": "allowed_tools", "allowed_tools": {"mode": "required",
    "tools": [named choices]}}`."""
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
    seed: int | None = Field(default=None, ge=_SEED_MIN, le=_SEED_MAX)
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
    return_token_logprobs: bool = False
    """This server's extension: add `token_logprobs` (per choice, and per chunk when
    streaming), the sampled tokens' logprobs as plain floats beside `token_ids`. What a
    recorder needs, without OpenAI's per-token objects (text, bytes, alternatives) that
    the client would parse only to read one float from each."""
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
        if len(items) > 4 or any(not s or len(s) > 256 for s in items):
            raise ValueError("stop takes at most 4 non-empty strings of at most 256 characters")
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
            _check_json_schema(js.get("schema", {}))
        return v

    @field_validator("structured_outputs")
    @classmethod
    def _structured(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return None
        keys = [k for k in ("json", "regex", "grammar", "choice") if v.get(k) is not None]
        if len(keys) != 1:
            raise ValueError("structured_outputs takes exactly one of json, regex, grammar, choice")
        (key,) = keys
        value = v[key]
        if key == "json":
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    raise ValueError("structured_outputs.json is not valid JSON") from None
            if not isinstance(value, dict):
                raise ValueError("structured_outputs.json must be a JSON Schema object")
            _check_json_schema(value)
        elif key in ("regex", "grammar") and not isinstance(value, str):
            raise ValueError(f"structured_outputs.{key} must be a string")
        elif key == "choice" and (
            not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value)
        ):
            raise ValueError("structured_outputs.choice must be a non-empty list of strings")
        return v

    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def mode(self) -> Literal["none", "auto", "required", "named"]:
        """How tools are used for this request (`allowed_tools` is "required": one or more
        calls, of the tools `allowed_names` lists)."""
        if not self.tools:
            return "none"
        tc = self.tool_choice
        if tc is None or tc == "auto":
            return "auto"
        if tc == "none":
            return "none"
        if tc == "required":
            return "required"
        if isinstance(tc, AllowedToolsChoice):
            if tc.allowed_tools.mode != "required":
                raise ValueError(
                    'allowed_tools with mode "auto" is not supported: use mode "required"'
                )
            return "required"
        return "named"

    def allowed_names(self) -> list[str] | None:
        """The names of the tools a call may name (`allowed_tools`); None: every tool."""
        tc = self.tool_choice
        if isinstance(tc, AllowedToolsChoice):
            return [t.function.name for t in tc.allowed_tools.tools]
        return None

    def message_dicts(self) -> list[dict[str, Any]]:
        """The messages as plain dicts (unknown fields kept), for the chat template."""
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        return [
            {"type": "function", "function": t.function.model_dump(exclude_none=True)}
            for t in self.tools
        ]


# ------------------------------------------------------------------------- responses
class _Out(BaseModel):
    """A response record: the fields named in `_omit_none` are left out when None."""

    _omit_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_unset_extras(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in self._omit_none:
            if data.get(key, 0) is None:
                del data[key]
        return data


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class ResponseMessage(_Out):
    _omit_none = frozenset({"tool_calls"})
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """Set only when the model called tools (OpenAI's `{"id", "type", "function"}` dicts)."""


class Choice(_Out):
    _omit_none = frozenset({"token_ids", "token_logprobs"})
    index: int
    message: ResponseMessage
    finish_reason: str
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] | None = None
    """vLLM's extra: the completion's token ids (with `return_token_ids`)."""
    token_logprobs: list[float] | None = None
    """This server's extra: each completion token's logprob (with `return_token_logprobs`)."""
    stop_reason: int | str | None = None
    """vLLM's extra: the stop string or token that ended the completion, if any."""


class PromptTokensDetails(BaseModel):
    """OpenAI's breakdown of the prompt tokens (`usage.prompt_tokens_details`)."""

    cached_tokens: int = 0
    """Prompt tokens whose KV came from the engine's prefix cache, not from a prefill."""


class Usage(BaseModel):
    """Token counts of one request; the prompt is counted once, however many choices."""

    prompt_tokens: int
    completion_tokens: int
    """Summed over the choices."""
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class ChatCompletion(_Out):
    _omit_none = frozenset({"prompt_token_ids"})
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    """The weights that answered: `name@step`."""
    choices: list[Choice]
    usage: Usage
    prompt_token_ids: list[int] | None = None
    """vLLM's extra: the rendered prompt's token ids (with `return_token_ids`)."""


class Delta(_Out):
    _omit_none = frozenset({"role", "content", "tool_calls"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(_Out):
    _omit_none = frozenset({"logprobs", "token_ids", "token_logprobs"})
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] | None = None
    token_logprobs: list[float] | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(_Out):
    _omit_none = frozenset({"usage", "prompt_token_ids"})
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
