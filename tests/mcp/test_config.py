"""`HarnessConfig`'s defaults that depend on the run: the learning rate from the model's width, the
warm start's epochs from the demonstrations."""

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


def test_the_warm_start_runs_by_default_only_with_demonstrations() -> None:
    """sft_epochs None: three epochs when there are demonstrations (the scenarios' own or
    --sft), none without; a number given is kept, and no demonstrations means no warm start."""
    from art_mcp.config import DEFAULT_SFT_EPOCHS

    assert HarnessConfig().warm_start_epochs(64) == DEFAULT_SFT_EPOCHS == 3
    assert HarnessConfig().warm_start_epochs(0) == 0
    assert HarnessConfig(sft_epochs=0).warm_start_epochs(64) == 0
    assert HarnessConfig(sft_epochs=2).warm_start_epochs(64) == 2
    assert HarnessConfig(sft_epochs=2).warm_start_epochs(0) == 0
