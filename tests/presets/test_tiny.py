"""The tiny preset: offline, deterministic, cached, and a chat template that renders tools."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file
from transformers import AutoTokenizer

from art_langgraph.presets import TinySpec, build_tiny, resolve_preset

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
]


def test_build_is_deterministic_and_cached(tmp_path: Path) -> None:
    spec = TinySpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    a = build_tiny(tmp_path / "a", spec)
    b = build_tiny(tmp_path / "b", spec)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert json.loads((a / "tokenizer.json").read_text()) == json.loads(
        (b / "tokenizer.json").read_text()
    )
    stamp = (a / "art_preset.json").stat().st_mtime_ns
    assert build_tiny(tmp_path / "a", spec) == a  # reused, not rebuilt
    assert (a / "art_preset.json").stat().st_mtime_ns == stamp
    assert not [p for p in (tmp_path / "a" / "presets").iterdir() if p.name.startswith(".")]


def test_resolve_preset_leaves_other_ids_alone(tiny_path: Path) -> None:
    assert resolve_preset("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_preset("/some/local/folder") == "/some/local/folder"
    assert Path(resolve_preset("tiny")) == tiny_path


def test_template_renders_tools_and_tool_calls(tiny_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_path)
    text = tok.apply_chat_template(CONVO, tools=TOOLS, tokenize=False)
    # Tools are one compact line each (a short prompt: the tiny model learns in fewer steps).
    assert "# Tools\nget_weather(city?: string): Weather in a city\n" in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.startswith("<|im_start|>system\nBe brief.")


def test_generation_markers_mask_exactly_the_assistant_turns(tiny_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_path)
    out = tok.apply_chat_template(
        CONVO, tools=TOOLS, return_assistant_tokens_mask=True, return_dict=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    masked = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert masked == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
        "It is sunny.<|im_end|>"
    )


def test_tool_markup_is_single_tokens(tiny_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_path)
    for marker in ("<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1
    # tool markup decodes as text; chat markup is special
    ids = tok.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"
