"""The dtype rules of `art_langgraph/runtime/devices.py`: `auto` picks bfloat16 only where the CPU
multiplies it in hardware and the model is larger than FLOAT32_MAX_PARAMS (or of unknown
size), and an explicit choice always wins; `parameter_count` counts a model without
loading it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from art_langgraph.runtime import devices


@pytest.mark.parametrize(
    ("flags", "engine", "compute"),
    [
        ({"avx2", "fma"}, "float32", "float32"),
        ({"avx2", "avx512_bf16"}, "bfloat16", "bfloat16"),
        ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16", "bfloat16"),
    ],
)
def test_auto_follows_the_cpu_flags(monkeypatch, flags, engine, compute) -> None:
    monkeypatch.setattr(devices, "cpu_flags", lambda: set(flags))
    assert devices.pick_engine_dtype(None, "cpu") == engine
    assert devices.pick_engine_dtype("auto", "cpu") == engine
    # the trainer's frozen weights follow the engine's (one shared copy); float32 weights a
    # caller chose get bfloat16 autocast where the CPU multiplies it in hardware
    assert devices.pick_dtype("auto", "cpu") == engine
    assert devices.pick_compute_dtype("auto", engine, "cpu") == engine
    assert devices.pick_compute_dtype("auto", "float32", "cpu") == compute


def test_explicit_choices_and_cuda_are_not_overridden(monkeypatch) -> None:
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"amx_bf16"})
    assert devices.pick_engine_dtype("float32", "cpu") == "float32"
    assert devices.pick_compute_dtype("float32", "float32", "cpu") == "float32"
    assert devices.pick_engine_dtype(None, "cuda") == "bfloat16"
    assert devices.pick_dtype(None, "cuda:0") == "bfloat16"
    assert devices.pick_compute_dtype("auto", "bfloat16", "cuda") == "bfloat16"
    monkeypatch.setattr(devices, "cpu_flags", lambda: set())
    assert devices.pick_compute_dtype("bfloat16", "float32", "cpu") == "bfloat16"


@pytest.mark.parametrize(
    ("flags", "device", "auto"),
    [
        ({"avx2", "fma"}, "cpu", "float32"),  # emulated bfloat16: the model's
        ({"avx2", "avx512_bf16"}, "cpu", "bfloat16"),
        ({"amx_bf16"}, "cpu", "bfloat16"),
        (set(), "cuda", "bfloat16"),
    ],
)
def test_an_sft_steps_dtype_is_bfloat16_where_it_is_fast(monkeypatch, flags, device, auto) -> None:
    monkeypatch.setattr(devices, "cpu_flags", lambda: set(flags))
    assert devices.pick_sft_compute_dtype("auto", "float32", device) == auto
    assert devices.pick_sft_compute_dtype("model", "float32", device) == "float32"
    assert devices.pick_sft_compute_dtype("bfloat16", "float32", device) == "bfloat16"
    assert devices.pick_sft_compute_dtype("float32", "bfloat16", device) == "float32"


SMALL, LARGE = 135_000_000, 360_000_000


@pytest.mark.parametrize("flags", [{"avx2", "avx512_bf16"}, {"avx2", "amx_bf16", "amx_tile"}])
def test_auto_keeps_a_small_model_in_float32_where_bfloat16_is_fast(monkeypatch, flags) -> None:
    monkeypatch.setattr(devices, "cpu_flags", lambda: set(flags))
    assert devices.FLOAT32_MAX_PARAMS >= SMALL
    assert devices.pick_engine_dtype(None, "cpu", SMALL) == "float32"
    assert devices.pick_dtype("auto", "cpu", SMALL) == "float32"
    assert devices.pick_compute_dtype("auto", "float32", "cpu", SMALL) == "float32"
    assert devices.pick_engine_dtype(None, "cpu", LARGE) == "bfloat16"
    assert devices.pick_compute_dtype("auto", "float32", "cpu", LARGE) == "bfloat16"
    assert devices.pick_engine_dtype(None, "cuda", SMALL) == "bfloat16"
    assert devices.pick_engine_dtype("bfloat16", "cpu", SMALL) == "bfloat16"
    line = devices.describe_machine(params=SMALL)
    assert line.endswith("engine float32, trainer float32"), line
    assert devices.describe_machine("bfloat16", params=SMALL).endswith("trainer bfloat16")


def test_parameter_count_reads_the_config_only(tmp_path) -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
    )  # fmt: skip
    config.save_pretrained(tmp_path)  # a config and no weights: nothing to load
    # embeddings (tied head) + 2 x (4 attention and 3 MLP projections, 2 norms) + final norm
    expected = 1000 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert devices.parameter_count(str(tmp_path)) == expected
    assert devices.parameter_count(str(tmp_path / "missing")) is None
    assert devices.parameter_count("no-such-owner/no-such-model") is None
    # counted once per config as it is: a rewritten config is counted again
    config.num_hidden_layers = 1
    config.save_pretrained(tmp_path)
    assert devices.parameter_count(str(tmp_path)) == expected - (expected - 1000 * 64 - 64) // 2


def test_an_isa_cap_below_bfloat16_turns_auto_to_float32(monkeypatch) -> None:
    # oneDNN capped at AVX2 emulates bfloat16 on an AMX CPU: auto must not pick it there
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f", "amx_bf16"})
    for name in devices.ISA_CAP_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert devices.cpu_has_fast_bf16() and devices.pick_engine_dtype(None, "cpu") == "bfloat16"
    assert "capped" not in devices.matmul_flags()
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")  # float32 only: bfloat16 stays fast
    assert devices.cpu_has_fast_bf16()
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "avx512_core_amx")
    assert devices.cpu_has_fast_bf16()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # read before DNNL_
    assert not devices.cpu_has_fast_bf16()
    assert devices.pick_engine_dtype(None, "cpu") == "float32"
    assert devices.pick_compute_dtype("auto", "float32", "cpu") == "float32"
    flags = devices.matmul_flags()
    assert flags.startswith("amx_bf16,avx512f,avx2 (instruction sets capped: "), flags
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in flags and "MKL_ENABLE_INSTRUCTIONS=AVX2" in flags
    assert (
        "(oneDNN capped below bfloat16: bfloat16 would be emulated)" in devices.describe_machine()
    )


@pytest.mark.skipif(platform.machine() != "x86_64", reason="AVX2 is an x86-64 instruction set")
def test_a_capped_process_computes_with_avx2_and_auto_knows_it() -> None:
    # the real environment, no monkeypatch: torch's kernels and `auto` read the same caps
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    code = (
        "import torch; from art_langgraph.runtime import devices; "
        "print(torch.backends.cpu.get_cpu_capability(), devices.pick_engine_dtype(None, 'cpu'), "
        "'capped' in devices.matmul_flags())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AVX2", "float32", "True"], out.stdout
