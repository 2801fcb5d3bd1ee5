"""The torch engine's decode step against the machine's limits: how far a faster engine could go.

A decode step reads every weight of the model once (packed for oneDNN, as the engine runs)
and every row's KV cache once, and multiplies each row by every weight. For each batch
shape (rows x context tokens) this times the step as the engine runs it (its KV cache,
prepacked weights, `bench.probes.engine_packed`'s loop) and sets it against two floors measured
in the same process:

- **memory**: the bytes a step must read (the linear weights including the head, and the
  rows' keys and values, each once) over the machine's read bandwidth (the sum of a 512
  MiB float32 tensor on all threads);
- **compute**: the step's FLOPs (2 a weight a row, and attention's) at the rate of a
  large matmul of the model's own shapes.

`step / floor` is how much a perfect kernel set could still win; vLLM's CPU build reads
the same float32 weights and the same KV bytes. On an x86 host with more than AVX2 the
bench runs the shapes twice, in child processes: as the host is, and with every library
capped at AVX2 (`ONEDNN_MAX_CPU_ISA`, `MKL_ENABLE_INSTRUCTIONS`, `ATEN_CPU_CAPABILITY`;
docs/development.md), which computes as an AVX2-only host does.

    .venv/bin/python -m bench.probes.decode_roofline [--base-model smollm2-135m] [--steps 12]

Left out: prefill (compute-bound, bench.agent_rollouts), bfloat16 (float32 is `auto`'s
choice for SmolLM2-135M on every CPU), GPUs (bench.gpu_speed), the trainer
(bench.trainer_roofline).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.readme import publish, results_dir
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("decode_roofline") / "decode_roofline.json"
SHAPES = ((1, 600), (16, 300), (16, 800), (32, 900))
"""Rows x context: one agent, a GRPO step's 16 rows early and late in their turns, 32 rows."""
AVX2_CAP = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
}


def _read_gbs(torch: Any) -> float:
    """The machine's read bandwidth (GB/s): the median of 5 sums of 512 MiB of float32."""
    a = torch.ones(128 * 1024 * 1024)
    a.sum()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a.sum()
        times.append(time.perf_counter() - t0)
    return a.numel() * 4 / statistics.median(times) / 1e9


def _matmul_gflops(torch: Any, hidden: int, inter: int) -> float:
    """GFLOP/s of a (2048 x hidden) @ (hidden x intermediate) float32 matmul."""
    a, b = torch.randn(2048, hidden), torch.randn(hidden, inter)
    a @ b
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * 2048 * hidden * inter / statistics.median(times) / 1e9


def _child(args: argparse.Namespace) -> None:
    """Measure every shape in this process and write the rows as JSON to `args.json`."""
    from bench.probes.engine_packed import _decode_ms, _set_packed, load_float32

    model = load_float32(args.base_model)
    import torch

    _set_packed(model, True)
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    linear = sum(
        m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)
    )  # the head included (tied or not, it is multiplied by)
    bw = _read_gbs(torch)
    gflops = _matmul_gflops(torch, c.hidden_size, c.intermediate_size)
    rows = []
    for b, t in SHAPES:
        ms, _ = _decode_ms(model, b, t, args.steps)
        width = t + args.steps // 2  # the cache's mean width over the timed steps
        kv = c.num_hidden_layers * b * width * c.num_key_value_heads * head_dim * 2 * 4
        weights = linear * 4
        flops = (
            2 * linear * b + c.num_hidden_layers * 4 * b * c.num_attention_heads * width * head_dim
        )
        mem_ms = (weights + kv) / (bw * 1e9) * 1000
        flop_ms = flops / (gflops * 1e9) * 1000
        rows.append(
            {
                "rows": b,
                "context": t,
                "step_ms": ms,
                "weights_mib": weights / 2**20,
                "kv_mib": kv / 2**20,
                "memory_floor_ms": mem_ms,
                "compute_floor_ms": flop_ms,
                "step_over_floor": ms / max(mem_ms, flop_ms),
                "tokens_per_s": b / ms * 1000,
            }
        )
        print(rows[-1], flush=True)
    out = {"flags": cpu_flags(), "read_gbs": bw, "matmul_gflops": gflops, "rows": rows}
    Path(args.json).write_text(json.dumps(out))


def _arms() -> list[tuple[str, dict[str, str]]]:
    """The host as it is, and capped at AVX2 where it has more (x86 with AVX-512 or AMX)."""
    arms = [("host", {})]
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if platform.machine() in ("x86_64", "AMD64") and ("avx512f" in flags or "amx_" in flags):
        arms.append(("AVX2 cap", AVX2_CAP))
    return arms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    results = []
    for name, cap in _arms():
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            cmd = [sys.executable, "-m", "bench.probes.decode_roofline", "--child"]
            cmd += ["--json", str(out), "--base-model", args.base_model, "--steps", str(args.steps)]
            env = {k: v for k, v in os.environ.items() if k not in AVX2_CAP}
            subprocess.run(cmd, env={**env, **cap}, check=True)
            results.append({"arm": name, **json.loads(out.read_text())})
    lines = [
        f"{args.base_model}, float32, weights packed for oneDNN, one decode step (median of "
        f"{args.steps}), 2 cores ({platform.machine()}); each arm in its own process\n",
        "| kernels | rows x context | step (ms) | tokens/s | weights + KV read (MiB) "
        "| memory floor (ms) | compute floor (ms) | step / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for r in res["rows"]:
            lines.append(
                f"| {res['arm']} | {r['rows']} x {r['context']} | {r['step_ms']:.0f} "
                f"| {r['tokens_per_s']:.0f} | {r['weights_mib']:.0f} + {r['kv_mib']:.0f} "
                f"| {r['memory_floor_ms']:.0f} | {r['compute_floor_ms']:.0f} "
                f"| {r['step_over_floor']:.2f}x |"
            )
    lines.append("")
    lines += [
        f"- {res['arm']}: CPU flags {res['flags']}; read bandwidth {res['read_gbs']:.1f} GB/s, "
        f"float32 matmul {res['matmul_gflops']:.0f} GFLOP/s"
        for res in results
    ]
    publish("decode_roofline", RESULTS, lines, args, arms=results)


if __name__ == "__main__":
    main()
