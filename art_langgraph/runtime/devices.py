"""Where and in what precision models run: one rule for the engine and the trainer.

The device is the caller's choice, else CUDA when present, else the CPU. The dtypes are
the caller's choice, else (`auto`) the machine's fast one:

- the engine's weights (`pick_engine_dtype`): bfloat16 on CUDA; on a CPU that multiplies
  bfloat16 in hardware (AMX, AVX-512-BF16), float32 for a model of at most
  `FLOAT32_MAX_PARAMS` parameters (`parameter_count`) and bfloat16 above; float32 on
  other CPUs, and on one whose instruction sets the environment caps below bfloat16
  (`ISA_CAP_VARIABLES`: an AMX host capped at AVX2 computes as an AVX2 one);
- the trainer's frozen weights (`pick_dtype`): the engine's dtype, so that in one process
  the trainer's LoRA wraps the engine's own weights instead of a second copy
  (`engine/shared_base.py`). The LoRA's weights and the optimizer stay in float32 everywhere
  (peft keeps an adapter over bfloat16 weights in float32);
- the trainer's matmuls (`pick_compute_dtype`): the weights dtype; bfloat16 autocast over
  float32 weights where a caller chose float32 weights for a model above
  `FLOAT32_MAX_PARAMS` on a CPU that multiplies bfloat16 in hardware.

The trainer's log-softmax runs in float32 in every case, over logits in the weights
dtype, as the engine computes the sampler's. torch is imported only when a
function is called. `describe_machine` says all this in one line for a run's log.
Left out: MPS and multi-GPU placement.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

FLOAT32_MAX_PARAMS = 270_000_000
"""The largest model `auto` keeps in float32 on a CPU that multiplies bfloat16 in hardware
(float32 weights of about 1 GiB). On such a host (2 AMX cores) SmolLM2-135M learned more in
float32 than in bfloat16 on both bundled tasks, on all 10 seeds (sampled held-out success
+0.68 and +0.49 on average against +0.47 and +0.21), at 1.2-1.8x the wall time and no more
peak memory (bench/results/learning/learning_*_amx*.json, docs/results.md); its float32 runs
peaked at 3.3-3.6 GiB, so a model over ~270M parameters (SmolLM2-360M: +0.9 GB of float32
weights) would pass a training run's 4 GiB there, and its step time grows with its size:
above this, bfloat16."""


def pick_device(device: str | None = None) -> str:
    """`device`, else "cuda" when available, else "cpu"."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(dtype: str | None, device: str, params: int | None = None) -> str:
    """The trainer's frozen weights: `dtype` ("float32", "bfloat16", "float16"), or for
    None/"auto" the engine's (`pick_engine_dtype`), so the two share one copy."""
    if dtype and dtype != "auto":
        return dtype
    return pick_engine_dtype(None, device, params)


def _small(params: int | None) -> bool:
    """Whether a model of `params` parameters (None: unknown) stays in float32 (see
    `FLOAT32_MAX_PARAMS`)."""
    return params is not None and params <= FLOAT32_MAX_PARAMS


def pick_engine_dtype(dtype: str | None, device: str, params: int | None = None) -> str:
    """The engine's weights: `dtype`, or for None/"auto" bfloat16 on CUDA; on a CPU that
    multiplies bfloat16 in hardware, float32 for a model of `params` <= FLOAT32_MAX_PARAMS
    parameters and bfloat16 for a larger or unknown one; float32 on other CPUs."""
    if dtype and dtype != "auto":
        return dtype
    if device.startswith("cpu"):
        return "bfloat16" if cpu_has_fast_bf16() and not _small(params) else "float32"
    return "bfloat16"


def pick_compute_dtype(
    compute: str | None, weights: str, device: str, params: int | None = None
) -> str:
    """The trainer's matmuls over `weights`-dtype weights: `compute`, or for None/"auto"
    the weights dtype, except bfloat16 over float32 weights of a model above
    FLOAT32_MAX_PARAMS (or of unknown size) on CPUs that multiply it in hardware."""
    if compute and compute != "auto":
        return compute
    if device.startswith("cpu") and weights == "float32" and cpu_has_fast_bf16():
        return "float32" if _small(params) else "bfloat16"
    return weights


def pick_sft_compute_dtype(sft: str, compute: str, device: str) -> str:
    """An SFT step's matmuls over a trainer computing in `compute`: `sft`, or for "model"
    `compute`, or for "auto" bfloat16 where `device` multiplies it in hardware (CUDA, or a
    CPU with `cpu_has_fast_bf16`) and `compute` otherwise."""
    if sft == "model" or (sft == "auto" and device.startswith("cpu") and not cpu_has_fast_bf16()):
        return compute
    return "bfloat16" if sft == "auto" else sft


def model_config_file(path: str) -> Path | None:
    """The config.json of a local model folder, or of a Hub id already in the Hugging Face
    cache (nothing is downloaded); None where there is none here."""
    local = Path(path).expanduser()
    if local.is_dir():
        found = local / "config.json"
        return found if found.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
    except Exception:  # a name that is no Hub id
        return None
    return Path(cached) if isinstance(cached, str) else None


def parameter_count(path: str) -> int | None:
    """The parameters of the causal LM whose config is at `path` (`model_config_file`),
    counted on the meta device: nothing is loaded or downloaded. None where there is no
    config to read here or it builds no model. Counted once per config as its file reads
    (a run asks for the engine, the trainer and the machine line)."""
    config_file = model_config_file(path)
    if config_file is None:
        return None
    try:
        return _count_parameters(str(config_file.parent.absolute()), config_file.read_text())
    except Exception:  # an odd or partial config: the size is unknown
        return None


@functools.lru_cache(maxsize=16)
def _count_parameters(folder: str, config_text: str) -> int:
    """`parameter_count` of the model in `folder`, whose config.json reads `config_text`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(f.read().split())
    except OSError:
        return set()


ISA_CAP_VARIABLES = (
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "ATEN_CPU_CAPABILITY",
)
"""Environment variables that cap the instruction sets torch's CPU kernels may use: oneDNN's
(its bfloat16 matmuls; `ONEDNN_` is read before `DNNL_`), MKL's (float32 matmuls) and
ATen's own vectorised kernels. Capped at AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2`), an AMX host computes as an AVX2
one does: float32 matmuls measured 1.8x slower there, bfloat16 ones ~500x (emulated)."""

_BF16_ISAS = frozenset(
    {
        "AVX512_CORE_BF16",
        "AVX512_CORE_FP16",
        "AVX512_CORE_AMX",
        "AVX512_CORE_AMX_FP16",
        "AVX10_1_512",
        "AVX10_1_512_AMX",
        "AVX10_1_512_AMX_FP16",
        "AVX10_2_512",
        "AVX10_2_512_AMX_2",
        "ALL",
        "DEFAULT",
    }
)
"""The values of oneDNN's ISA cap that still let it multiply bfloat16 in hardware."""


def isa_caps() -> dict[str, str]:
    """The `ISA_CAP_VARIABLES` set in this process's environment, with their values."""
    return {k: os.environ[k] for k in ISA_CAP_VARIABLES if os.environ.get(k)}


def matmul_flags() -> str:
    """The CPU's matmul-relevant flags, for a log line or a benchmark table: amx_bf16,
    avx512_bf16, avx512f, avx2 (those it has, comma-separated), followed by the
    instruction-set caps set in the environment (`isa_caps`), if any."""
    have = cpu_flags()
    wanted = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")
    flags = ",".join(f for f in wanted if f in have) or "none of amx/avx512/avx2"
    caps = isa_caps()
    if caps:
        flags += " (instruction sets capped: " + ", ".join(f"{k}={v}" for k, v in caps.items())
        flags += ")"
    return flags


def _hardware_bf16() -> bool:
    """Whether the CPU has AMX or AVX-512-BF16, caps aside."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX or AVX-512-BF16) and oneDNN's
    instruction sets are not capped below it (`ISA_CAP_VARIABLES`). Without it (AVX2 only)
    bfloat16 matmuls are emulated: measured 3-5x slower than float32 on a 2-core AVX2
    machine, against ~1.85x faster than float32 on an AMX one."""
    if not _hardware_bf16():
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return not cap or cap.strip().upper() in _BF16_ISAS


def describe_machine(
    engine_dtype: str | None = None, compute_dtype: str | None = None, params: int | None = None
) -> str:
    """This machine in one line, for a run's first lines: the device, cores, the CPU flags
    that decide the dtypes, and the engine's and the trainer's dtypes as `auto` (or the
    names given) resolve here for a model of `params` parameters in an embedded backend,
    where the trainer computes in the engine's weights dtype unless told otherwise."""
    device = pick_device()
    engine = pick_engine_dtype(None if engine_dtype == "auto" else engine_dtype, device, params)
    compute = engine if compute_dtype in (None, "auto") else compute_dtype
    if device.startswith("cuda"):
        import torch

        where = torch.cuda.get_device_name(0)
    else:
        where = f"CPU, {os.cpu_count()} cores, flags {matmul_flags()}"
        if not _hardware_bf16():
            where += " (no AMX or AVX-512-BF16: bfloat16 would be emulated)"
        elif not cpu_has_fast_bf16():
            where += " (oneDNN capped below bfloat16: bfloat16 would be emulated)"
    return f"{where}; engine {engine}, trainer {compute}"


def torch_dtype(name: str) -> Any:
    """The torch dtype named `name`."""
    import torch

    return getattr(torch, name)
