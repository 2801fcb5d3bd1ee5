"""What the vLLM engine hands to vLLM, checked without vLLM: our llguidance grammars as the
Lark text its `guidance` backend takes, and a missing vLLM environment as a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

import art_langgraph as art
from art_langgraph.engine.constrained import GrammarCompiler
from art_langgraph.engine.torch_engine import TorchEngine
from art_langgraph.engine.vllm_config import VLLMEngineConfig
from art_langgraph.engine.vllm_engine import VLLMEngine, to_lark
from art_langgraph.errors import UsageError


@pytest.fixture(scope="module")
def grammars(engine: TorchEngine) -> GrammarCompiler:
    return engine.grammars


def _accepts(g: GrammarCompiler, lark: str, text: str) -> bool:
    m = llguidance.LLMatcher(g.ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(lark))
    ids = g.ll_tokenizer.tokenize_str(text)
    return bool(m.consume_tokens(ids)) and m.is_accepting()


def test_every_grammar_kind_becomes_lark_that_means_the_same(grammars: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    json_lark = to_lark(grammars.json_schema(schema))
    assert json_lark.startswith("start: %json ")
    assert json.loads(json_lark[len("start: %json ") :])["x-guidance"]  # our JSON settings kept
    assert _accepts(grammars, json_lark, '{"n": 12}')
    assert not _accepts(grammars, json_lark, '{"n": "x"}')
    regex = to_lark(grammars.structured({"regex": "[0-9]+"}))
    assert _accepts(grammars, regex, "123") and not _accepts(grammars, regex, "12a")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    tool_lark = to_lark(grammars.tool_calls(tools))
    assert tool_lark == grammars.tool_calls(tools)  # Lark already
    with pytest.raises(UsageError, match="one grammar"):
        to_lark('{"grammars": [{}, {}]}')


def test_without_a_vllm_environment_the_error_says_how_to_get_one(
    tmp_path: Path, tiny_path: Path
) -> None:
    config = VLLMEngineConfig(python=str(tmp_path / "no-such-python"))
    with pytest.raises(UsageError, match="no-such-python does not exist: run scripts/setup-vllm"):
        VLLMEngine.start(str(tiny_path), config, tmp_path / "vllm.log")
    with pytest.raises(UsageError, match="engine must be"):
        art.LocalBackend(tmp_path, engine="tensorrt")  # type: ignore[arg-type]
