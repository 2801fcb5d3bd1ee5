"""Where presets are built, and the one way a preset folder is written: atomically.

`cached_folder(key, build)` returns `<cache>/presets/<key>/` if it is complete (it holds
`art_preset.json`, written last), else builds it in a temp folder beside it and renames
it into place: a crash mid-build leaves nothing half-written, and two processes building
the same key at once both end with the complete folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = "art_preset.json"
"""Written last by every build: a folder holding it is complete."""


def default_cache_dir() -> Path:
    """`$ART_CACHE_DIR`, else `$XDG_CACHE_HOME/art_langgraph`, else `~/.cache/art_langgraph`."""
    if env := os.environ.get("ART_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "art_langgraph"


def cached_folder(key: str, build: Callable[[Path], None], cache_dir: Path | None = None) -> Path:
    """The complete preset folder for `key`, built with `build(tmp_folder)` if missing."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / "presets" / key
    if (folder / MARKER).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=folder.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, folder)
        except OSError:
            # Another process finished first: its folder is complete; keep it.
            if not (folder / MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
