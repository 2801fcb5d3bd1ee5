"""`HarnessConfig`'s defaults that depend on the model: the learning rate from its width."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_mcp.config import SWEPT_LEARNING_RATE, HarnessConfig, default_learning_rate


def test_the_learning_rate_follows_the_model_width(tmp_path: Path) -> None:
    assert default_learning_rate("tiny")[0] == 5e-4
    assert default_learning_rate("smollm2-135m") == (SWEPT_LEARNING_RATE, "swept on SmolLM2-135M")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 2304}))
    lr, why = default_learning_rate(str(tmp_path))
    assert lr == pytest.approx(SWEPT_LEARNING_RATE / 2) and "sqrt(576 / 2304)" in why
    lr, why = default_learning_rate("someone/unknown-model")
    assert lr == SWEPT_LEARNING_RATE and "unknown" in why
    assert HarnessConfig().lr() == SWEPT_LEARNING_RATE  # the default base model: SmolLM2
    assert HarnessConfig(learning_rate=1e-5).lr() == 1e-5
