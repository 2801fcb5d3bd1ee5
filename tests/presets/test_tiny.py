"""The tiny preset: offline, deterministic, cached, and a chat template that renders tools."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

from art_langgraph.errors import UsageError
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


def test_resolve_preset_leaves_folders_and_reachable_hub_ids_alone(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_preset(str(tmp_path)) == str(tmp_path)
    assert Path(resolve_preset("tiny")) == tiny_path
    answers = {"/api/models/owner/there": 200, "/api/models/owner/gone": 404}

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(answers.get(self.path, 500))
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.server_address[1]}")
        assert resolve_preset("owner/there") == "owner/there"
        with pytest.raises(UsageError, match=r"no such model.*HTTP 404.*tiny, smollm2-135m"):
            resolve_preset("owner/gone")
    finally:
        hub.shutdown()
        hub.server_close()
    # a hub that is not there: one refused connection, then the error (no retries)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.server_address[1]}")
    with pytest.raises(UsageError, match=r"cannot be reached from here.*a preset \(tiny"):
        resolve_preset("owner/there")


@pytest.mark.parametrize("name", ["smollm2", "/no/such/folder", "llama 3", "a/b/c"])
def test_an_unknown_base_model_is_refused_without_asking_the_hub(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    def no_network(*args: object, **kw: object) -> None:
        raise AssertionError("asked the hub")

    monkeypatch.setattr(httpx, "head", no_network)
    with pytest.raises(UsageError, match=r"unknown base model.*a preset \(tiny, smollm2-135m\)"):
        resolve_preset(name)


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
