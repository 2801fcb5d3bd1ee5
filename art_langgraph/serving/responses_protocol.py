"""The wire format of `/v1/responses` (OpenAI's Responses API) and its translation to chat.

Requests (`ResponsesRequest`): `model`, `input` (a string, or a list of items: messages
whose content is a string or a list of `input_text`/`output_text` parts, `function_call`
items and `function_call_output` items), `instructions`, function tools in Responses'
flat form (`{"type": "function", "name", "description", "parameters"}`), `tool_choice`
("none", "auto", "required" or `{"type": "function", "name"}`), `parallel_tool_calls`,
`max_output_tokens`, `temperature`, `top_p`, `seed`, `text.format` (text, json_object,
json_schema), `include: ["message.output_text.logprobs"]` with `top_logprobs`, `stream`,
and our `return_token_ids` / `return_token_logprobs`. Unknown fields are accepted and
ignored, as on chat completions (`user`, `metadata`, `prompt_cache_key`, ...).

`unsupported(body)` names what this server refuses rather than ignores: stored state
(`previous_response_id`, `conversation`, `store: true`, stored `prompt`s, `item_reference`
items), `background`, built-in tools (web_search, file_search, ...), `truncation: "auto"`,
`reasoning` settings, and non-text input (images, files).

The translation is pure (no torch, so the capturing client imports it too):
`chat_body` turns a request into the body of an equivalent chat completion
(instructions become the system message, consecutive `function_call` items one
assistant message with `tool_calls`, each `function_call_output` a `tool` message), and
`as_chat_completion` turns a response into the chat completion it amounts to.

Responses (`ResponseObject`, typed): `output` holds a `message` item (one `output_text`
part) and/or `function_call` items (`call_id` is the chat tool call's id); `usage` has
`input_tokens`, `output_tokens`, `total_tokens` and their details. With
`return_token_ids` the response carries `prompt_token_ids` and `token_ids`, with
`return_token_logprobs` `token_logprobs` (top level: a response has one completion);
these extras are left out of the JSON when not asked for.

Left out: stored responses (nothing is kept: `store` is always false), reasoning items,
annotations, audio, images and files.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from art_langgraph.serving.chat_protocol import (
    _SEED_MAX,
    _SEED_MIN,
    FunctionSpec,
    _check_json_schema,
    _Out,
)

LOGPROBS_INCLUDE = "message.output_text.logprobs"
_ITEM_TYPES = ("message", "function_call", "function_call_output")


# ------------------------------------------------------------------------- requests
class ResponsesTool(FunctionSpec):
    """A function tool in Responses' flat form: chat's function spec, with its type beside."""

    type: Literal["function"] = "function"


class NamedFunctionChoice(BaseModel):
    """`{"type": "function", "name": ...}`: call this tool."""

    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=256)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            _check_json_schema(v)
        return v


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(BaseModel):
    """Body of POST /v1/responses (see the module doc)."""

    model_config = ConfigDict(extra="allow")

    model: str
    """`name` (latest step) or `name@step` (pinned)."""
    input: str | list[dict[str, Any]]
    """A user message's text, or a list of message / function_call / function_call_output items."""
    instructions: str | None = None
    """A system message put before the input."""
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=_SEED_MIN, le=_SEED_MAX)
    text: TextConfig | None = None
    include: list[str] | None = None
    """Only "message.output_text.logprobs" changes anything (the others name outputs of
    built-in tools or reasoning, which never appear here)."""
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    metadata: dict[str, str] | None = None
    """Echoed back, as OpenAI does; stored nowhere."""
    stream: bool = False
    return_token_ids: bool = False
    """Add `prompt_token_ids` and `token_ids` to the response (vLLM's names)."""
    return_token_logprobs: bool = False
    """Add `token_logprobs`, one float per completion token."""

    @field_validator("input")
    @classmethod
    def _input(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(v, list) and not v:
            raise ValueError("input must not be an empty list")
        return v

    def logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])


def unsupported(body: dict[str, Any]) -> tuple[str, str] | None:
    """(param, message) for the first feature in `body` this server refuses (see the module
    doc), or None."""
    stateless = (
        "this server keeps no state between requests: send the whole conversation in `input`"
    )
    if body.get("previous_response_id") is not None:
        return "previous_response_id", f"previous_response_id is not supported: {stateless}"
    if body.get("conversation") is not None:
        return "conversation", f"conversation is not supported: {stateless}"
    if body.get("store") is True:
        return "store", f"store=true is not supported: {stateless} (or leave store out)"
    if body.get("background"):
        return "background", "background mode is not supported: send the request and wait for it"
    if body.get("prompt") is not None:
        return "prompt", "stored prompt templates are not supported: send instructions and input"
    if body.get("truncation") not in (None, "disabled"):
        return "truncation", "truncation='auto' is not supported: only 'disabled'"
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and any(v is not None for v in reasoning.values()):
        return "reasoning", "reasoning settings are not supported: the served models do not reason"
    for i, tool in enumerate(body.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            return (
                f"tools[{i}].type",
                f"tools[{i}]: the tool type {kind!r} is not supported: this server runs only "
                "function tools ({'type': 'function', 'name', 'description', 'parameters'})",
            )
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") != "function":
        return (
            "tool_choice",
            f"tool_choice of type {choice.get('type')!r} is not supported: use 'none', 'auto', "
            "'required' or {'type': 'function', 'name': ...}",
        )
    items = body.get("input")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            return f"input[{i}]", f"input[{i}] must be an object"
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in _ITEM_TYPES:
            return (
                f"input[{i}].type",
                f"input[{i}]: items of type {kind!r} are not supported: this server takes "
                f"{', '.join(_ITEM_TYPES)} items (it keeps no state to refer to)",
            )
        content = item.get("content")
        for part in content if isinstance(content, list) else []:
            ptype = part.get("type") if isinstance(part, dict) else None
            if ptype not in ("input_text", "output_text", "text", "refusal"):
                return (
                    f"input[{i}].content",
                    f"input[{i}]: content parts of type {ptype!r} are not supported (text only)",
                )
    return None


# ---------------------------------------------------------------------- translation
def _parts_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be a string or a list of text parts")
    texts = []
    for part in content:
        if not isinstance(part, dict):
            raise ValueError(f"{where}: each content part must be an object")
        text = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{where}: a {part.get('type')!r} part needs its text")
        texts.append(text)
    return "".join(texts)


def chat_messages(instructions: str | None, input: str | list[Any]) -> list[dict[str, Any]]:
    """`instructions` + `input` -> the OpenAI chat messages they amount to."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(input, str):
        messages.append({"role": "user", "content": input})
        return messages
    turn_open = False  # the last message is an assistant turn a function_call may extend
    for i, item in enumerate(input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ValueError(f"{where}.role must be user, system, developer or assistant")
            messages.append({"role": role, "content": _parts_text(item.get("content"), where)})
            turn_open = role == "assistant"
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise ValueError(f"{where}: a function_call item needs name and call_id")
            args = item.get("arguments", "{}")
            call = {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            if not turn_open:
                messages.append({"role": "assistant", "content": None})
                turn_open = True
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ValueError(f"{where}: a function_call_output item needs call_id")
            output = item.get("output")
            if output is None:
                raise ValueError(f"{where}: a function_call_output item needs output")
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _parts_text(output, where)}
            )
            turn_open = False
        else:
            raise ValueError(f"{where}: items of type {kind!r} are not supported")
    return messages


def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools -> chat's `{"type": "function", "function": {...}}`."""
    if not tools:
        return None
    out = []
    for t in tools:
        spec = t.model_dump(exclude_none=True) if isinstance(t, BaseModel) else dict(t)
        spec.pop("type", None)
        out.append(
            {"type": "function", "function": {k: v for k, v in spec.items() if v is not None}}
        )
    return out


def chat_tool_choice(choice: Any) -> Any:
    """Responses' tool_choice -> chat's (a named choice nests its name under `function`)."""
    if isinstance(choice, NamedFunctionChoice):
        return {"type": "function", "function": {"name": choice.name}}
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def chat_body(req: ResponsesRequest) -> dict[str, Any]:
    """The body of the chat completion that answers `req` (validated by the caller)."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(req.instructions, req.input),
        "parallel_tool_calls": req.parallel_tool_calls,
        "return_token_ids": req.return_token_ids,
        "return_token_logprobs": req.return_token_logprobs,
        "stream": req.stream,
    }
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    if tools := chat_tools(req.tools):
        body["tools"] = tools
    if req.tool_choice is not None:
        body["tool_choice"] = chat_tool_choice(req.tool_choice)
    for ours, theirs in (
        ("max_output_tokens", "max_completion_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("seed", "seed"),
    ):
        if (v := getattr(req, ours)) is not None:
            body[theirs] = v
    if req.logprobs():
        body["logprobs"] = True
        body["top_logprobs"] = req.top_logprobs or 0
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        spec: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema_ or {}}
        if fmt.strict is not None:
            spec["strict"] = fmt.strict
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    return body


def as_chat_completion(response: dict[str, Any]) -> dict[str, Any]:
    """A Responses response (JSON) -> the chat completion (JSON) it amounts to: one choice
    whose message holds the output text and the function calls (by `call_id`)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            texts += [p.get("text") or "" for p in item.get("content") or [] if "text" in p]
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    incomplete = (response.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "length" if incomplete else "tool_calls" if calls else "stop",
        "logprobs": None,
    }
    for key in ("token_ids", "token_logprobs"):
        if response.get(key) is not None:
            choice[key] = response[key]
    usage = response.get("usage") or {}
    out: dict[str, Any] = {
        "id": response.get("id"),
        "object": "chat.completion",
        "created": response.get("created_at"),
        "model": response.get("model"),
        "choices": [choice],
    }
    if usage:
        out["usage"] = {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
            "total_tokens": usage.get("total_tokens"),
            "prompt_tokens_details": {
                "cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
            },
        }
    if response.get("prompt_token_ids") is not None:
        out["prompt_token_ids"] = response["prompt_token_ids"]
    return out


# ------------------------------------------------------------------------ responses
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)
    """With `include: ["message.output_text.logprobs"]`: each completion token's logprob
    (and `top_logprobs` alternatives)."""


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseObject(_Out):
    """A response, as OpenAI's `Response` (the request's settings echoed back)."""

    _omit_none = frozenset({"prompt_token_ids", "token_ids", "token_logprobs"})
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    background: bool = False
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    model: str
    """The weights that answered: `name@step`."""
    output: list[OutputMessage | FunctionCallItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    reasoning: None = None
    store: bool = False
    temperature: float = 1.0
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float = 1.0
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    prompt_token_ids: list[int] | None = None
    """With `return_token_ids`: the rendered prompt's token ids."""
    token_ids: list[int] | None = None
    """With `return_token_ids`: the completion's token ids."""
    token_logprobs: list[float] | None = None
    """With `return_token_logprobs`: each completion token's logprob."""
