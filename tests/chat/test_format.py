"""Tool-call parsing, streaming hold-back, message normalization, and the sampled ids an
assistant message carries (pure functions; the last test uses the tiny preset's tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from art_langgraph.chat.format import (
    ToolCallHoldback,
    parse_tool_calls,
    render_prompt,
    sampled_matches,
    template_messages,
)
from art_langgraph.errors import UsageError


def test_parses_one_call_with_leading_content() -> None:
    p = parse_tool_calls(
        'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert p.content == "Let me check."
    assert p.tool_calls is not None and len(p.tool_calls) == 1
    fn = p.tool_calls[0]["function"]
    assert fn["name"] == "f" and json.loads(fn["arguments"]) == {"x": 1}
    assert fn["arguments"] == '{"x": 1}'  # as the model wrote it
    assert p.tool_calls[0]["id"].startswith("call_") and not p.malformed


def test_parses_parallel_calls_and_keeps_compact_arguments() -> None:
    text = '<tool_call>\n{"name":"a","arguments":{"q":"é"}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
    p = parse_tool_calls(text)
    assert p.content is None
    assert [c["function"]["name"] for c in p.tool_calls or []] == ["a", "b"]
    assert (p.tool_calls or [])[0]["function"]["arguments"] == '{"q":"é"}'


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": "{broken"}\n</tool_call>',
        '<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call><tool_call>oops</tool_call>',
    ],
)
def test_malformed_calls_stay_content(text: str) -> None:
    p = parse_tool_calls(text)
    assert p.malformed and p.tool_calls is None and p.content == text


def test_a_repeated_opener_still_parses() -> None:
    p = parse_tool_calls(
        '<tool_call>\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert not p.malformed and p.content is None
    assert [c["function"]["name"] for c in p.tool_calls or []] == ["f"]


def test_plain_text_and_unclosed_opener_are_content() -> None:
    assert parse_tool_calls("hello").content == "hello"
    assert parse_tool_calls("").content is None
    p = parse_tool_calls('<tool_call>\n{"name": "f"')
    assert p.tool_calls is None and p.content == '<tool_call>\n{"name": "f"'


def test_holdback_releases_text_before_a_call_only() -> None:
    h = ToolCallHoldback()
    assert h.release("Hi") == "Hi"
    assert h.release("Hi <tool") == " "  # partial opener held
    assert h.release("Hi <tool_call>") == ""
    assert h.release('Hi <tool_call>\n{"name"') == ""
    h2 = ToolCallHoldback()
    assert h2.release("a <to") == "a "
    assert h2.release("a <tomato") == "<tomato"


def test_template_messages() -> None:
    msgs = template_messages(
        [
            {
                "role": "developer",
                "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
            },
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "1",
                        "type": "function",
                        "function": {"name": "f", "arguments": {"a": 1}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "1", "content": "2"},
        ]
    )
    assert msgs[0] == {"role": "system", "content": "be brief"}
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert msgs[3]["tool_call_id"] == "1"


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([], "must not be empty"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "needs content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "image_url"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}], "function.name"),
    ],
)
def test_normalize_rejects_bad_messages(messages: list, needle: str) -> None:
    with pytest.raises(UsageError, match=None) as info:
        template_messages(messages)
    assert needle in str(info.value)


def test_normalize_keeps_an_assistants_sampled_ids_and_checks_them() -> None:
    msgs = template_messages(
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "y", "token_ids": [5, 6]},
        ]
    )
    assert msgs[1] == {"role": "assistant", "content": "y", "token_ids": [5, 6]}
    for bad in ("5 6", [5, "6"], [True]):
        with pytest.raises(UsageError, match=r"messages\[0\].token_ids"):
            template_messages([{"role": "assistant", "content": "y", "token_ids": bad}])


def test_sampled_text_matches_the_message_it_became() -> None:
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": 1, "b": "é"}'},
    }
    msg = {"role": "assistant", "content": "", "tool_calls": [call]}
    sampled = '<tool_call>\n{"name": "f", "arguments": {"b":"\\u00e9","a":1}}\n</tool_call>'
    assert sampled_matches(sampled, msg)
    assert sampled_matches("Sure.\n" + sampled, {**msg, "content": "Sure."})
    assert not sampled_matches(sampled.replace('"a":1', '"a":2'), msg)  # edited arguments
    assert not sampled_matches(sampled.replace('"f"', '"g"'), msg)
    assert not sampled_matches(sampled + sampled, msg)
    assert not sampled_matches("no call", msg)
    # A reply served without tools is its text, tool-call markup or not.
    assert sampled_matches(sampled + " ", {"role": "assistant", "content": sampled})
    assert sampled_matches(" hi\n", {"role": "assistant", "content": "hi"})
    assert not sampled_matches("hi", {"role": "assistant", "content": "an edit"})


def test_render_prompt_uses_sampled_ids_only_where_they_match(tiny_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_path)
    user = {"role": "user", "content": "hi"}
    sampled = [i for ch in "hello" for i in tok.encode(ch, add_special_tokens=False)]

    def prompt(content: str, ids: list[int]) -> list[int]:
        reply = {"role": "assistant", "content": content, "token_ids": ids}
        return render_prompt(tok, template_messages([user, reply, user]))

    first = render_prompt(tok, template_messages([user]))
    assert prompt("hello", sampled)[: len(first) + len(sampled)] == first + sampled
    from_text = render_prompt(
        tok, template_messages([user, {"role": "assistant", "content": "hallo"}, user])
    )
    assert prompt("hallo", sampled) == from_text  # the message was edited: its text
    too_big = [*sampled[:-1], len(tok) + 7]
    assert prompt("hello", too_big) != prompt("hello", sampled)  # not this tokenizer's ids
    assert tok.decode(prompt("hello", too_big)) == tok.decode(prompt("hello", sampled))
