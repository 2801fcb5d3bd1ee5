"""Chat format between the server and the engine: messages -> prompt ids, completion text -> tool calls.

`render_prompt` renders OpenAI-format messages (and tools) with the tokenizer's own
chat template and returns the prompt token ids. `parse_tool_calls` turns a Qwen-style
completion (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks) into
OpenAI `tool_calls`; if any block is not valid JSON of that shape the whole completion
stays plain content (the caller records it; nothing raises). `ToolCallHoldback`
decides, while streaming, which text is safe to send as content before a tool call
may begin.

An assistant message may carry `token_ids`, the completion ids the engine sampled for
it (`TrainableChatModel` sends them back with the history): `render_prompt` renders such
a message as exactly those ids, so each turn of a rollout extends the previous prompt +
completion token for token. The ids are used only where they say what the message says
(decoded and parsed as the server parses a completion, they give its content and tool
calls; a message edited since, or ids from another tokenizer, are rendered from text).

Templates that ignore tools get them in one generic format (`chat/templates.py`),
which this parser reads back. Left out: other model families' own tool-call formats
(Llama, Mistral); such models get the generic format.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from art_langgraph.errors import UsageError

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
# The innermost opener before each closer: a weak model that repeats the opener
# (`<tool_call>\n<tool_call>\n{...}</tool_call>`) still gets its call parsed.
_BLOCK = re.compile(
    re.escape(TOOL_CALL_OPEN)
    + r"((?:(?!"
    + re.escape(TOOL_CALL_OPEN)
    + r").)*?)"
    + re.escape(TOOL_CALL_CLOSE),
    re.DOTALL,
)
_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _text(content: Any, where: str) -> str | None:
    """OpenAI content (str, list of parts, None) -> str or None."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise UsageError(
                    f"{where}: content parts of type {kind!r} are not supported (text only)"
                )
        return "".join(parts)
    raise UsageError(f"{where}: content must be a string, a list of text parts or null")


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check OpenAI-format messages and bring them to the shape chat templates expect."""
    if not messages:
        raise UsageError("messages must not be empty")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise UsageError(f"{where} must be an object")
        role = m.get("role")
        if role not in _ROLES:
            raise UsageError(f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role}
        content = _text(m.get("content"), where)
        if role != "assistant" and content is None:
            raise UsageError(f"{where}: a {role} message needs content")
        msg["content"] = content if content is not None else ""
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for j, tc in enumerate(m["tool_calls"]):
                fn = tc.get("function") if isinstance(tc, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise UsageError(f"{where}.tool_calls[{j}] needs function.name")
                args = fn.get("arguments", "{}")
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                calls.append(
                    {
                        "id": tc.get("id"),
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": args},
                    }
                )
            msg["tool_calls"] = calls
        if role == "assistant" and m.get("token_ids") is not None:
            ids = m["token_ids"]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise UsageError(f"{where}.token_ids must be a list of integers")
            msg["token_ids"] = ids
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
            if m.get("name"):
                msg["name"] = m["name"]
        out.append(msg)
    return out


def render_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """Render messages (already normalized) and tools; returns prompt ids.

    Tools go through the template where it renders them, else in the generic format
    (`chat/templates.py`); a template that cannot render them raises UsageError. An
    assistant message's `token_ids` are rendered as they are where they match the message
    (see the module doc), else dropped.
    """
    from art_langgraph.chat.templates import ChatFormat

    if any("token_ids" in m for m in messages):
        messages = [_checked_ids(tokenizer, m) if "token_ids" in m else m for m in messages]
    return ChatFormat.of(tokenizer).prompt_ids(messages, tools)


def _checked_ids(tokenizer: Any, message: dict[str, Any]) -> dict[str, Any]:
    """`message` with its `token_ids` where they decode to what it says, else without them."""
    ids = message["token_ids"]
    if ids and all(0 <= t < len(tokenizer) for t in ids):
        text = str(tokenizer.decode(ids, skip_special_tokens=True))
        if sampled_matches(text, message):
            return message
    return {k: v for k, v in message.items() if k != "token_ids"}


def sampled_matches(text: str, message: dict[str, Any]) -> bool:
    """Whether a completion's text is what an assistant message (normalized) says: its
    content and tool calls as `parse_tool_calls` reads them (arguments compared as JSON),
    or, for a message without calls, its content as it is (whitespace at the ends aside)."""
    content = (message.get("content") or "").strip()
    calls = message.get("tool_calls") or []
    if not calls and text.strip() == content:
        return True
    parsed = parse_tool_calls(text)
    if (parsed.content or "").strip() != content or len(parsed.tool_calls or []) != len(calls):
        return False
    for got, want in zip(parsed.tool_calls or [], calls, strict=True):
        if got["function"]["name"] != want["function"]["name"]:
            return False
        if _canonical(got["function"]["arguments"]) != _canonical(want["function"]["arguments"]):
            return False
    return True


def _canonical(arguments: str) -> str | None:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except json.JSONDecodeError:
        return None


@dataclass
class ParsedCompletion:
    """A completion split into content and tool calls."""

    content: str | None
    tool_calls: list[dict[str, Any]] | None
    malformed: bool = False
    """True when the text held a tool-call block that could not be parsed (kept as content)."""


def _raw_arguments(block: str, args: Any) -> str:
    """The arguments as the model wrote them, when a standard serialization matches."""
    for candidate in (
        json.dumps(args, ensure_ascii=False),
        json.dumps(args, ensure_ascii=False, separators=(",", ":")),
        json.dumps(args),
    ):
        if candidate in block:
            return candidate
    return json.dumps(args, ensure_ascii=False)


def parse_tool_calls(text: str) -> ParsedCompletion:
    """Split a completion into content and OpenAI tool calls (see the module doc)."""
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        return ParsedCompletion(content=text or None, tool_calls=None)
    calls = []
    for b in blocks:
        body = b.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return ParsedCompletion(content=text, tool_calls=None, malformed=True)
        name, args = (
            (obj.get("name"), obj.get("arguments", {})) if isinstance(obj, dict) else (None, None)
        )
        if not isinstance(name, str) or not name or not isinstance(args, dict | str):
            return ParsedCompletion(content=text, tool_calls=None, malformed=True)
        if isinstance(args, str):
            try:
                json.loads(args)
            except json.JSONDecodeError:
                return ParsedCompletion(content=text, tool_calls=None, malformed=True)
            arguments = args
        else:
            arguments = _raw_arguments(body, args)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    content = text[: blocks[0].start()].replace(TOOL_CALL_OPEN, "").strip()
    return ParsedCompletion(content=content or None, tool_calls=calls)


class ToolCallHoldback:
    """While streaming with tools: how much of the text so far may go out as content.

    Text before a `<tool_call>` opener is content; from the opener on, everything is
    held until the end, when `parse_tool_calls` decides. A trailing partial opener
    (`<tool_`) is held back until the next token tells.
    """

    def __init__(self) -> None:
        self.sent = 0
        self.holding = False

    def release(self, text: str) -> str:
        """The new content that can be sent now, given the whole text so far."""
        if self.holding:
            return ""
        at = text.find(TOOL_CALL_OPEN)
        if at >= 0:
            self.holding = True
            safe = at
        else:
            safe = len(text)
            for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
                if TOOL_CALL_OPEN.startswith(text[-k:]):
                    safe = len(text) - k
                    break
        out = text[self.sent : safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return out
