"""`backend_for`: one rule for the backend `train`, `check` and `art-mcp scenarios` run on."""

from __future__ import annotations

from pathlib import Path

import pytest

import art_langgraph as art
from art_mcp.backends import backend_for
from art_mcp.config import HarnessConfig


def test_the_defaults_build_an_embedded_auto_backend(tmp_path: Path) -> None:
    said: list[str] = []
    backend = backend_for(HarnessConfig(path=str(tmp_path)), None, said.append)
    assert isinstance(backend, art.LocalBackend) and backend.engine_choice.kind == "auto"
    assert backend.engine_choice.config is None and said == []


def test_engine_settings_reach_the_engine_they_name(tmp_path: Path) -> None:
    torch_cfg = HarnessConfig(path=str(tmp_path), engine_dtype="float32", chat_template="{{ x }}")
    torch_backend = backend_for(torch_cfg, None, print)
    assert isinstance(torch_backend, art.LocalBackend)
    assert torch_backend.engine_choice.kind == "torch"
    assert torch_backend.engine_choice.config.dtype == "float32"  # type: ignore[union-attr]
    assert torch_backend.engine_choice.config.chat_template == "{{ x }}"  # type: ignore[union-attr]
    said: list[str] = []
    vllm_cfg = HarnessConfig(path=str(tmp_path), engine="vllm", engine_dtype="float32")
    vllm_backend = backend_for(vllm_cfg, None, said.append)
    assert isinstance(vllm_backend, art.LocalBackend)
    assert vllm_backend.engine_choice.kind == "vllm" and said == []
    assert vllm_backend.engine_choice.config.dtype == "float32"  # type: ignore[union-attr]


@pytest.mark.parametrize("given", [True, False])
def test_a_given_or_remote_backend_keeps_its_own_engine(tmp_path: Path, given: bool) -> None:
    said: list[str] = []
    mine = art.LocalBackend(path=tmp_path)
    cfg = HarnessConfig(
        path=str(tmp_path), engine_dtype="float32", backend=None if given else "http://127.0.0.1:9"
    )
    backend = backend_for(cfg, mine if given else None, said.append)
    assert backend is mine if given else isinstance(backend, art.RemoteBackend)
    assert len(said) == 1 and "keeps its own" in said[0]
