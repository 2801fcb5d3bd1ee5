"""The README's config tables are generated from the config classes and must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_config_tables_are_current() -> None:
    out = subprocess.run(
        [sys.executable, "scripts/docs.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def test_every_config_field_is_documented() -> None:
    from art_langgraph.training.config import ModelConfig, TrainConfig

    for cls in (TrainConfig, ModelConfig):
        for name, field in cls.model_fields.items():
            assert field.description and len(field.description) > 10, f"{cls.__name__}.{name}"
