"""The vLLM engine's settings (`VLLMEngineConfig`, each field documented in place) and the
environment its server runs in: the vLLM environment's Python (`vllm_python`), the dtype
and LoRA rank vLLM is given, the libraries preloaded on the CPU, and torch's compile cache.
The docs' table of these settings (docs/configuration.md) is written from the field
docstrings (`scripts/docs.py`).

Left out: the engine itself (`vllm_engine.py`, which manages the server and speaks to it).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from art_langgraph.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def vllm_python() -> Path | None:
    """The Python of the vLLM environment: `$ART_VLLM_PYTHON`, else `.venv-vllm` in the
    repository; None when neither exists."""
    env = os.environ.get("ART_VLLM_PYTHON")
    candidates = [Path(env)] if env else []
    candidates.append(ROOT / ".venv-vllm" / "bin" / "python")
    for c in candidates:
        if c.exists():
            return c
    return None


@dataclass(frozen=True)
class VLLMEngineConfig:
    """Settings of the managed vLLM server."""

    python: str | None = None
    """The vLLM environment's Python; None: `vllm_python()`."""
    dtype: str = "auto"
    """vLLM's --dtype: auto (bfloat16 on GPUs; on CPUs bfloat16 where the CPU multiplies it in
    hardware, AMX or AVX-512-BF16, else float32: emulated bfloat16 prefill measured 3-4x
    slower than float32 on an AVX2 CPU),
    float32, bfloat16."""
    max_model_len: int | None = None
    """vLLM's --max-model-len; None: the model's own context length."""
    max_loras: int = 4
    """Adapters vLLM keeps loaded at once (--max-loras); the backend unloads older steps."""
    max_lora_rank: int | None = None
    """Largest LoRA rank vLLM accepts (--max-lora-rank); None: the registered model's `lora_r`
    (rounded up to a size vLLM supports). Keep it tight: vLLM pads every adapter to it, and
    on this CPU rank 64 instead of 8 cut LoRA decoding from 107 to 21 tokens/s."""
    kv_cache_gib: float = 2.0
    """On the CPU: the KV cache's size (VLLM_CPU_KVCACHE_SPACE), in GiB."""
    cpu_threads_bind: str | None = "auto"
    """On the CPU: VLLM_CPU_OMP_THREADS_BIND; "auto" binds one thread per core (0-N), the
    setting measured fastest here; None leaves vLLM's default."""
    preload: bool = True
    """On the CPU: LD_PRELOAD tcmalloc and Intel's OpenMP when the vLLM environment has them
    (vLLM's CPU guide; measured faster here)."""
    prefix_caching: bool = True
    """vLLM's automatic prefix caching (--enable-prefix-caching; False passes
    --no-enable-prefix-caching): a prompt that starts like an earlier one (the next turn of
    a conversation, a shared system prompt) reuses that prompt's KV blocks instead of
    prefilling them again, in whole KV blocks (vLLM's block size: 128 tokens on its CPU build).
    Blocks are keyed by the adapter's name and folder. Measured on this shared 2-core CPU
    (SmolLM2-135M, fp32, a 1,816-token conversation answered with one token): 9-16 s fresh,
    0.45-1.7 s for its next turn (1,827 tokens, 1,792 of them cached); 10-16 s with this
    off."""
    metrics_refresh_s: float = 2.0
    """`metrics()` re-reads vLLM's /metrics (for the running and waiting gauges) in the
    background when its last reading is older than this, in seconds (> 0); a scrape never
    waits for it."""
    startup_timeout_s: float = 300.0
    """How long to wait for the server's /health at start-up."""
    engine_args: tuple[str, ...] = ()
    """More flags for vLLM's server, passed through as given (e.g. ("--enforce-eager",))."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """More environment variables for the vLLM process."""
    chat_template: str | None = None
    """A Jinja chat template (text or file) replacing the tokenizer's own; our server renders
    prompts, so this is where it applies (as TorchEngineConfig.chat_template)."""

    def __post_init__(self) -> None:
        if self.metrics_refresh_s <= 0:
            raise UsageError(f"metrics_refresh_s must be > 0 seconds, got {self.metrics_refresh_s}")


def vllm_dtype(dtype: str) -> str:
    """`VLLMEngineConfig.dtype` as vLLM's --dtype (see that field)."""
    if dtype != "auto":
        return dtype
    import shutil

    from art_langgraph.runtime.devices import cpu_has_fast_bf16

    if shutil.which("nvidia-smi") is not None or cpu_has_fast_bf16():
        return "auto"
    return "float32"


def lora_size(rank: int) -> int:
    """The smallest --max-lora-rank vLLM supports that holds `rank`."""
    for size in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= size:
            return size
    raise UsageError(f"vLLM supports LoRA ranks up to 512, not {rank}")


def inductor_cache_dir() -> str:
    """Where torch's inductor keeps its compile cache when TORCHINDUCTOR_CACHE_DIR is unset
    (torch's `default_cache_dir`): `torchinductor_<user>` in the system's temporary folder."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    safe = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{safe}")


def preload_libs(venv: Path) -> list[str]:
    """tcmalloc and Intel OpenMP from the vLLM environment or the system, when present."""
    found = []
    for pattern in ("libtcmalloc_minimal.so*", "libtcmalloc.so*", "libiomp5.so"):
        hits = sorted(venv.glob(f"lib/python*/site-packages/**/{pattern}")) + sorted(
            Path("/usr/lib/x86_64-linux-gnu").glob(pattern)
        )
        if hits:
            found.append(str(hits[0]))
    tc = [f for f in found if "tcmalloc" in f][:1]  # one tcmalloc is enough
    return tc + [f for f in found if "iomp" in f]
