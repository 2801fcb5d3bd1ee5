"""Chat templates with tools, for any model: native where the template can, generic where not.

`ChatFormat.of(tokenizer)` inspects a tokenizer's chat template once (cached on the
tokenizer) and decides how chats with tools are rendered:

- **native**: the template renders tool specs, assistant tool calls as
  `<tool_call>{json}</tool_call>` (Qwen2.5, Hermes, the tiny preset) and tool results.
  Detected by rendering a probe chat with and without a probe tool and comparing.
- **generic**: the template ignores tools (SmolLM2, most plain ChatML templates) or writes
  calls in a format our parser does not read. The messages are rewritten before the
  template sees them, in one documented format (Qwen2.5's, which the parser, the
  constrained decoder and the streaming holdback already read):

  - the tool specs go at the end of the system message (a system message is added when
    there is none; where the template renders no system role, at the start of the first
    user message) as `# Tools` + one JSON spec per line inside `<tools></tools>` + how to
    call;
  - an assistant tool call becomes `<tool_call>\\n{"name": "<name>", "arguments": <args
    as the model wrote them>}\\n</tool_call>` after the content (a newline between calls);
  - consecutive tool results become one user message of
    `<tool_response>\\n<result>\\n</tool_response>` blocks, joined by newlines.

A template that cannot render system/user/assistant text at all (or none is set) is
unusable: rendering raises `UsageError`, which the server answers with a 400. Tools are
never dropped silently.

`training_ids(messages, tools)` gives the ids and the assistant mask for SFT. Templates
with `{% generation %}` markers use transformers' own mask; for the others the mask is
found from the text: each assistant turn is the difference between the chat rendered up
to it (with the generation prompt) and up to and including it, trailing whitespace left
out; tokens whose characters fall in a turn are trained.

Left out: other tool-call formats (Llama 3.1 JSON, Mistral `[TOOL_CALLS]`); such models
get the generic format too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from art_langgraph.errors import UsageError

__all__ = ["ChatFormat", "load_chat_template", "tools_system_text"]

_PROBE_NAME = "art_probe_fn"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE_NAME,
        "description": "art probe description",
        "parameters": {"type": "object", "properties": {"art_probe_arg": {"type": "string"}}},
    },
}
_CACHE_ATTR = "_art_chat_format"


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """The generic format's tool section (Qwen2.5's wording)."""
    specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{specs}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return f'<tool_call>\n{{"name": {json.dumps(fn["name"], ensure_ascii=False)}, "arguments": {args}}}\n</tool_call>'


def load_chat_template(value: str) -> str:
    """A `chat_template=` / `--chat-template` value: a file path, or the Jinja text itself."""
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise UsageError(f"chat template {value!r} is neither a file nor Jinja text")
    return path.read_text()


@dataclass
class ChatFormat:
    """How one tokenizer renders chats with tools (see the module doc)."""

    tokenizer: Any
    mode: Literal["native", "generic"]
    """native: the template renders tools itself; generic: messages are rewritten first."""
    system_role: bool
    """Whether the template renders a system message (where generic tool specs go)."""
    generation_markers: bool
    """Whether the template marks assistant turns with {% generation %}."""

    @classmethod
    def of(cls, tokenizer: Any) -> ChatFormat:
        """The format of `tokenizer`'s current template (probed once, cached on it)."""
        template = getattr(tokenizer, "chat_template", None)
        cached = getattr(tokenizer, _CACHE_ATTR, None)
        if cached is not None and cached[0] == template:
            return cached[1]
        fmt = cls._probe(tokenizer, template)
        setattr(tokenizer, _CACHE_ATTR, (template, fmt))
        return fmt

    @classmethod
    def _probe(cls, tok: Any, template: Any) -> ChatFormat:
        if not template:
            raise UsageError(
                "the tokenizer has no chat template: pass one (chat_template= / --chat-template FILE)"
            )
        if not isinstance(template, str):
            raise UsageError("only a single chat template (a string) is supported")

        def render(msgs: list[dict[str, Any]], **kw: Any) -> str:
            return str(tok.apply_chat_template(msgs, tokenize=False, **kw))

        user = {"role": "user", "content": "art probe user"}
        try:
            plain = render([user, {"role": "assistant", "content": "art probe assistant"}])
        except Exception as exc:
            raise UsageError(
                f"the chat template cannot render a user/assistant chat: {exc}"
            ) from exc
        if "art probe user" not in plain or "art probe assistant" not in plain:
            raise UsageError("the chat template does not render message contents")
        try:
            system_role = "art probe system" in render(
                [{"role": "system", "content": "art probe system"}, user]
            )
        except Exception:
            system_role = False
        native = False
        try:
            without = render([user], add_generation_prompt=True)
            with_tools = render([user], tools=[_PROBE_TOOL], add_generation_prompt=True)
            called = render(
                [
                    user,
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {
                                    "name": _PROBE_NAME,
                                    "arguments": '{"art_probe_arg": "art probe value"}',
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "art probe result"},
                ],
                tools=[_PROBE_TOOL],
            )
            native = (
                with_tools != without
                and _PROBE_NAME in with_tools
                and "<tool_call>" in called
                and "art probe value" in called
                and "art probe result" in called
            )
        except Exception:
            native = False
        return cls(
            tokenizer=tok,
            mode="native" if native else "generic",
            system_role=system_role,
            generation_markers="{% generation %}" in template or "{%- generation %}" in template,
        )

    # ---------------------------------------------------------------- rendering
    def messages_for_template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages and tools to hand the template (rewritten in generic mode)."""
        if self.mode == "native":
            return messages, tools or None
        out: list[dict[str, Any]] = []
        for m in messages:
            role = m["role"]
            if role == "assistant" and m.get("tool_calls"):
                calls = "\n".join(_call_text(c) for c in m["tool_calls"])
                content = f"{m['content']}\n{calls}" if m.get("content") else calls
                out.append({"role": "assistant", "content": content})
            elif role == "tool":
                block = f"<tool_response>\n{m['content']}\n</tool_response>"
                if out and out[-1].get("_tool_results"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool_results": True})
            else:
                out.append({"role": role, "content": m["content"]})
        for m in out:
            m.pop("_tool_results", None)
        if tools:
            section = tools_system_text(tools)
            if out[0]["role"] == "system" and self.system_role:
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{section}"}
            elif self.system_role:
                out.insert(0, {"role": "system", "content": section})
            else:
                first = next((i for i, m in enumerate(out) if m["role"] == "user"), 0)
                out[first] = {**out[first], "content": f"{section}\n\n{out[first]['content']}"}
        return out, None

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat as text, ready to tokenize (messages already normalized)."""
        msgs, tmpl_tools = self.messages_for_template(messages, tools)
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    msgs,
                    tools=tmpl_tools,
                    add_generation_prompt=add_generation_prompt,
                    tokenize=False,
                )
            )
        except UsageError:
            raise
        except Exception as exc:  # a template's raise_exception(), a Jinja error
            raise UsageError(f"the chat template cannot render these messages: {exc}") from exc

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Prompt token ids for a generation (messages already normalized)."""
        text = self.render(messages, tools, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False, verbose=False))

    def training_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> tuple[list[int], list[bool]]:
        """Token ids of a whole conversation and the mask of what the assistant wrote."""
        msgs, tmpl_tools = self.messages_for_template(messages, tools)
        if self.generation_markers:
            out = self.tokenizer.apply_chat_template(
                msgs, tools=tmpl_tools, return_assistant_tokens_mask=True, return_dict=True
            )
            return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
        full = self.render(messages, tools, add_generation_prompt=False)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = self.render(messages[:i], tools, add_generation_prompt=True)
            upto = self.render(messages[: i + 1], tools, add_generation_prompt=False).rstrip()
            if not (upto.startswith(before) and full.startswith(upto)):
                raise UsageError(
                    f"the chat template does not render message {i} as a prefix extension, "
                    "so its assistant tokens cannot be found"
                )
            spans.append((len(before), len(upto)))
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        mask = [
            any(s < end and start < e for s, e in spans) and end > start
            for start, end in enc["offset_mapping"]
        ]
        return list(enc["input_ids"]), mask
