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

`prompt_ids(messages, tools)` renders a prompt. An assistant message that carries
`token_ids` (the ids the engine sampled for it, sent back by `TrainableChatModel` and
checked against the message by `chat_format.render_prompt`) is rendered as exactly those
ids, not as its re-rendered text: the template renders a marker in its place, the text
around the markers is tokenized piece by piece and the sampled ids go between them (a
later call tokenizes the same pieces the same way, so its prompt extends the earlier
one wherever the template renders a longer chat as an extension of the shorter one's
text); the template's end-of-turn text right after a marker is left out
where the sampled ids already end with it (a sampled `<|im_end|>`). So a rollout's next
prompt is the previous prompt + the sampled completion + the new turns, token for token,
whichever split of the text the sampler chose (`E` `gypt` where the tokenizer writes
`Egypt`, `}` `}` for `}}`), and in the generic format whatever the model wrote around its
calls. A template that does not render such a message exactly once gets the text instead.

`training_ids(messages, tools)` gives the ids and the assistant mask for SFT. Templates
with `{% generation %}` markers use transformers' own mask; for the others the mask is
found from the text: each assistant turn is the difference between the chat rendered up
to it (with the generation prompt) and up to and including it, trailing whitespace left
out; tokens whose characters fall in a turn are trained.

Left out: other tool-call formats (Llama 3.1 JSON, Mistral `[TOOL_CALLS]`); such models
get the generic format too. The pieces around spliced ids are tokenized as the whole
text would be where they start and end at special tokens (ChatML's `<|im_start|>`,
`<|im_end|>`) and the tokenizer is byte-level BPE (GPT-2, Qwen, SmolLM, Llama 3); a
SentencePiece tokenizer that prefixes every encoded text with a space (Llama 2's legacy
mode) gets one more token per piece (the turns still extend each other).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from art_langgraph.errors import UsageError

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
# Where the template renders an assistant message whose sampled ids are spliced in:
# private-use code points, never in a real chat.
_SAMPLED_OPEN = "\ue000art sampled "
_SAMPLED_MARK = _SAMPLED_OPEN + "{}\ue001"


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
        """Prompt token ids for a generation (messages already normalized). An assistant
        message with `token_ids` is rendered as exactly those ids (see the module doc)."""
        sampled = {
            i: [int(t) for t in m["token_ids"]]
            for i, m in enumerate(messages)
            if m["role"] == "assistant" and m.get("token_ids")
        }
        if sampled:
            marked = [
                {"role": "assistant", "content": _SAMPLED_MARK.format(i)} if i in sampled else m
                for i, m in enumerate(messages)
            ]
            ids = self._spliced(self.render(marked, tools, add_generation_prompt=True), sampled)
            if ids is not None:
                return ids
        text = self.render(messages, tools, add_generation_prompt=True)
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False, verbose=False))

    def _spliced(self, text: str, sampled: dict[int, list[int]]) -> list[int] | None:
        """`text` with each marker replaced by its sampled ids; None where the template did
        not render every marker exactly once, in order."""
        ids: list[int] = []
        rest = text
        for i, completion in sampled.items():
            before, found, after = rest.partition(_SAMPLED_MARK.format(i))
            if not found or _SAMPLED_OPEN in before or _SAMPLED_MARK.format(i) in after:
                return None
            ids += self._encode(before)
            ids += completion
            rest = after[len(self._sampled_end(completion, after)) :]
        if _SAMPLED_OPEN in rest:
            return None
        return ids + self._encode(rest)

    def _sampled_end(self, completion: list[int], after: str) -> str:
        """The template's text after a marker that the sampled ids already hold: the text of
        their trailing special tokens (a sampled `<|im_end|>`) when the template writes it
        next, else ''."""
        special = set(self.tokenizer.all_special_ids)
        n = 0
        while n < len(completion) and completion[-1 - n] in special:
            n += 1
        for k in range(n, 0, -1):
            end = str(self.tokenizer.decode(completion[-k:], skip_special_tokens=False))
            if end and after.startswith(end):
                return end
        return ""

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
