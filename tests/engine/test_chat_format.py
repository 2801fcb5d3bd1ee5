"""Tool-call parsing, streaming hold-back and message normalization (pure functions)."""

from __future__ import annotations

import json

import pytest

from art_langgraph.engine.chat_format import ToolCallHoldback, normalize_messages, parse_tool_calls
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


def test_normalize_messages() -> None:
    msgs = normalize_messages(
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
        normalize_messages(messages)
    assert needle in str(info.value)
