"""Model presets that build offline (no model hub): today the `tiny` kit."""

from art_langgraph.presets.tiny import (
    TINY_PRESET,
    TinySpec,
    build_tiny,
    default_cache_dir,
    resolve_preset,
)

__all__ = ["TINY_PRESET", "TinySpec", "build_tiny", "default_cache_dir", "resolve_preset"]
