"""Where and in what precision models run: one rule for the engine and the trainer.

The device is the caller's choice, else CUDA when present, else the CPU. The dtypes are
the caller's choice, else (`auto`) the machine's fast one:

- the engine's weights (`pick_engine_dtype`): bfloat16 on CUDA and on CPUs that multiply
  bfloat16 in hardware (AMX, AVX-512-BF16), float32 on other CPUs;
- the trainer's frozen weights (`pick_dtype`): the engine's dtype, so that in one process
  the trainer's LoRA wraps the engine's own weights instead of a second copy
  (`engine/shared_base.py`): bfloat16 on CUDA and on CPUs that multiply it in hardware,
  float32 on other CPUs. The LoRA's weights and the optimizer stay in float32 everywhere
  (peft keeps an adapter over bfloat16 weights in float32);
- the trainer's matmuls (`pick_compute_dtype`): the weights dtype; bfloat16 autocast over
  float32 weights where a caller chose float32 weights on a CPU that multiplies bfloat16
  in hardware.

The trainer's log-softmax runs in float32 in every case, over logits in the weights
dtype, as the engine computes the sampler's. torch is imported only when a
function is called. `describe_machine` says all this in one line for a run's log.
Left out: MPS and multi-GPU placement.
"""

from __future__ import annotations

from typing import Any


def pick_device(device: str | None = None) -> str:
    """`device`, else "cuda" when available, else "cpu"."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(dtype: str | None, device: str) -> str:
    """The trainer's frozen weights: `dtype` ("float32", "bfloat16", "float16"), or for
    None/"auto" the engine's (`pick_engine_dtype`), so the two share one copy."""
    if dtype and dtype != "auto":
        return dtype
    return pick_engine_dtype(None, device)


def pick_engine_dtype(dtype: str | None, device: str) -> str:
    """The engine's weights: `dtype`, or for None/"auto" bfloat16 on CUDA and on CPUs that
    multiply it in hardware, float32 on other CPUs."""
    if dtype and dtype != "auto":
        return dtype
    if device.startswith("cpu"):
        return "bfloat16" if cpu_has_fast_bf16() else "float32"
    return "bfloat16"


def pick_compute_dtype(compute: str | None, weights: str, device: str) -> str:
    """The trainer's matmuls over `weights`-dtype weights: `compute`, or for None/"auto"
    the weights dtype, except bfloat16 over float32 weights on CPUs that multiply it in
    hardware."""
    if compute and compute != "auto":
        return compute
    if device.startswith("cpu") and weights == "float32" and cpu_has_fast_bf16():
        return "bfloat16"
    return weights


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(f.read().split())
    except OSError:
        return set()


def matmul_flags() -> str:
    """The CPU's matmul-relevant flags, for a log line or a benchmark table: amx_bf16,
    avx512_bf16, avx512f, avx2 (those it has, comma-separated)."""
    have = cpu_flags()
    wanted = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")
    return ",".join(f for f in wanted if f in have) or "none of amx/avx512/avx2"


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX or AVX-512-BF16). Without it
    (AVX2 only) bfloat16 matmuls are emulated: measured 3-5x slower than float32 on a
    2-core AVX2 machine, against ~1.85x faster than float32 on an AMX one."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def describe_machine(engine_dtype: str | None = None, compute_dtype: str | None = None) -> str:
    """This machine in one line, for a run's first lines: the device, cores, the CPU flags
    that decide the dtypes, and the engine's and the trainer's dtypes as `auto` (or the
    names given) resolve here."""
    import os

    device = pick_device()
    engine = pick_engine_dtype(None if engine_dtype == "auto" else engine_dtype, device)
    weights = pick_dtype(None, device)
    compute = pick_compute_dtype(compute_dtype, weights, device)
    if device.startswith("cuda"):
        import torch

        where = torch.cuda.get_device_name(0)
    else:
        where = f"CPU, {os.cpu_count()} cores, flags {matmul_flags()}"
        if not cpu_has_fast_bf16():
            where += " (no AMX or AVX-512-BF16: bfloat16 would be emulated)"
    return f"{where}; engine {engine}, trainer {compute}"


def torch_dtype(name: str) -> Any:
    """The torch dtype named `name`."""
    import torch

    return getattr(torch, name)
