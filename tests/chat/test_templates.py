"""Tools for any chat template: native detection, the generic format, the assistant mask.

Runs on the tiny preset's tokenizer with its own template (native) and with a plain
ChatML template that ignores tools (generic), so it needs no real model; the real
model's template is covered in tests/presets/test_smollm2.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from art_langgraph.chat.format import parse_tool_calls, template_messages
from art_langgraph.chat.templates import ChatFormat, load_chat_template
from art_langgraph.errors import UsageError

PLAIN_CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NO_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('no system role') }}{% endif %}{{'<|im_start|>' + message['role'] + "
    "'\n' + message['content'] + '<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"word": "naïve €5"}'},
}
CONVO = template_messages(
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Define naïve, please."},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"meaning": "innocent"}'},
        {"role": "tool", "tool_call_id": "c1", "content": "second result"},
        {"role": "assistant", "content": "It means innocent."},
    ]
)


def _tok(tiny_path: Path, template: str | None = None) -> Any:
    tok = AutoTokenizer.from_pretrained(tiny_path)
    if template is not None:
        tok.chat_template = template
    return tok


def test_the_tiny_template_is_native(tiny_path: Path) -> None:
    fmt = ChatFormat.of(_tok(tiny_path))
    assert fmt.mode == "native" and fmt.generation_markers and fmt.system_role


def test_a_template_that_ignores_tools_gets_the_generic_format(tiny_path: Path) -> None:
    tok = _tok(tiny_path, PLAIN_CHATML)
    plain = str(tok.apply_chat_template(CONVO[:2], tools=TOOLS, tokenize=False))
    assert "lookup" not in plain  # the template alone drops the tools silently
    fmt = ChatFormat.of(tok)
    assert fmt.mode == "generic" and not fmt.generation_markers
    text = fmt.render(CONVO, TOOLS, add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text
    # the assistant's call comes back through the parser as it went in
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = parse_tool_calls(turn)
    assert parsed.content == "Let me check."
    assert parsed.tool_calls and parsed.tool_calls[0]["function"]["name"] == "lookup"
    assert parsed.tool_calls[0]["function"]["arguments"] == CALL["function"]["arguments"]
    # consecutive tool results are one user turn of <tool_response> blocks
    assert (
        '<|im_start|>user\n<tool_response>\n{"meaning": "innocent"}\n</tool_response>\n'
        "<tool_response>\nsecond result\n</tool_response><|im_end|>"
    ) in text


def test_generic_tools_without_a_system_role_go_to_the_first_user_turn(tiny_path: Path) -> None:
    fmt = ChatFormat.of(_tok(tiny_path, NO_SYSTEM))
    assert fmt.mode == "generic" and not fmt.system_role
    text = fmt.render(CONVO[1:2], TOOLS)
    assert text.startswith("<|im_start|>user\n# Tools\n") and "Define naïve" in text


def test_rendering_does_not_change_the_callers_messages(tiny_path: Path) -> None:
    fmt = ChatFormat.of(_tok(tiny_path, PLAIN_CHATML))
    before = copy.deepcopy(CONVO)
    fmt.render(CONVO, TOOLS)
    assert before == CONVO


def test_the_format_follows_a_changed_template(tiny_path: Path) -> None:
    tok = _tok(tiny_path)
    assert ChatFormat.of(tok).mode == "native"
    tok.chat_template = PLAIN_CHATML
    assert ChatFormat.of(tok).mode == "generic"


@pytest.mark.parametrize("template", [None, "{{ 'no messages rendered' }}"])
def test_an_unusable_template_is_a_clear_error(tiny_path: Path, template: str | None) -> None:
    tok = _tok(tiny_path)
    tok.chat_template = template
    with pytest.raises(UsageError, match="chat template"):
        ChatFormat.of(tok)


def test_the_mask_from_text_equals_the_generation_markers(tiny_path: Path) -> None:
    """The tiny template with and without {% generation %}: the same ids, the same mask."""
    tok = _tok(tiny_path)
    marked = ChatFormat.of(tok).training_ids(CONVO, TOOLS)
    template = tok.chat_template
    tok.chat_template = template.replace("{%- generation %}", "").replace(
        "{%- endgeneration %}", ""
    )
    fmt = ChatFormat.of(tok)
    assert fmt.mode == "native" and not fmt.generation_markers
    assert fmt.training_ids(CONVO, TOOLS) == marked
    ids, mask = marked
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == (
        'Let me check.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "naïve €5"}}\n'
        "</tool_call><|im_end|>It means innocent.<|im_end|>"
    )


def test_generic_mask_covers_exactly_the_assistant_turns(tiny_path: Path) -> None:
    tok = _tok(tiny_path, PLAIN_CHATML)
    ids, mask = ChatFormat.of(tok).training_ids(CONVO, TOOLS)
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == (
        'Let me check.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "naïve €5"}}\n'
        "</tool_call><|im_end|>It means innocent.<|im_end|>"
    )


def test_load_chat_template_takes_a_file_or_text(tmp_path: Path) -> None:
    f = tmp_path / "t.jinja"
    f.write_text(PLAIN_CHATML)
    assert load_chat_template(str(f)) == PLAIN_CHATML
    assert load_chat_template(PLAIN_CHATML) == PLAIN_CHATML
    with pytest.raises(UsageError, match="neither a file nor Jinja"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def _sampled_turn(
    fmt: ChatFormat, convo: list[dict[str, Any]], tools: Any
) -> tuple[str, list[int]]:
    """The text the template writes for the last (assistant) message, and ids for it as a
    sampler might pick them: one token per character (never the tokenizer's own split),
    then the end-of-turn token."""
    before = fmt.render(convo[:-1], tools, add_generation_prompt=True)
    text = fmt.render(convo, tools, add_generation_prompt=False)[len(before) :]
    text = text.split("<|im_end|>")[0]
    tok = fmt.tokenizer
    ids = [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]
    return text, [*ids, tok.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.parametrize("template", [None, PLAIN_CHATML], ids=["native", "generic"])
def test_an_assistant_turn_with_sampled_ids_is_rendered_as_those_ids(
    tiny_path: Path, template: str | None
) -> None:
    """The next prompt starts with the previous prompt + the sampled ids, token for token,
    although the tokenizer splits the same text otherwise; the sampled `<|im_end|>` is not
    written twice, and the text is what the template renders."""
    fmt = ChatFormat.of(_tok(tiny_path, template))
    text, sampled = _sampled_turn(fmt, CONVO[:3], TOOLS)
    assert fmt.tokenizer.encode(text, add_special_tokens=False) != sampled[:-1]
    prompt = fmt.prompt_ids(CONVO[:2], TOOLS)
    history = [*CONVO[:2], {**CONVO[2], "token_ids": sampled}, *CONVO[3:5]]
    after = fmt.prompt_ids(history, TOOLS)
    assert after[: len(prompt) + len(sampled)] == prompt + sampled
    assert fmt.tokenizer.decode(after) == fmt.render(CONVO[:5], TOOLS)
    assert history[2]["token_ids"] == sampled  # the caller's messages are left alone
    # Without the ids the turn is re-encoded from text: the prefix breaks.
    assert fmt.prompt_ids(CONVO[:5], TOOLS)[: len(prompt) + len(sampled)] != prompt + sampled


def test_sampled_ids_without_an_end_of_turn_token_get_the_templates(tiny_path: Path) -> None:
    fmt = ChatFormat.of(_tok(tiny_path, PLAIN_CHATML))
    convo: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello there"},
    ]
    _, sampled = _sampled_turn(fmt, convo, None)
    ids = fmt.prompt_ids([convo[0], {**convo[1], "token_ids": sampled[:-1]}, convo[0]])
    assert fmt.tokenizer.decode(ids) == fmt.render([convo[0], convo[1], convo[0]])


def test_a_template_that_drops_an_earlier_turn_gets_the_text(tiny_path: Path) -> None:
    """A template that renders only the last assistant message (as templates that drop
    earlier reasoning do) cannot hold the sampled ids: the prompt is the rendered text."""
    last_only = PLAIN_CHATML.replace(
        "{% for message in messages %}",
        "{% for message in messages %}{% if message['role'] != 'assistant' or loop.last %}",
    ).replace("{% endfor %}", "{% endif %}{% endfor %}")
    fmt = ChatFormat.of(_tok(tiny_path, last_only))
    convo: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    _, sampled = _sampled_turn(fmt, [*convo, *convo], None)
    history = [convo[0], {**convo[1], "token_ids": sampled}, convo[0]]
    assert fmt.prompt_ids(history) == fmt.tokenizer.encode(
        fmt.render(history), add_special_tokens=False
    )
