"""oneDNN's packed multiply fed many row counts: time and memory of two of SmolLM2-135M's
linear shapes (576 -> 1536 -> 576, float32) called with every row count from 1 to
`--max-rows` (from `--min-rows`, every `--stride`-th), `--rounds` times, in four arms,
each in a process of its own:

- `plain`: `F.linear` (MKL; reorders the weight at every call);
- `packed_every_count`: `torch.ops.mkldnn._linear_pointwise` on the packed weight at
  each call's own row count (the engine's rule before: oneDNN builds and keeps a kernel,
  with its buffers, for every count it meets);
- `packed_then_linear`: the engine's rule for a layer's own weight before 2026-11-30 (at
  most `PACKED_ROWS` rows a packed multiply, rounded up to `ROW_BUCKET`; more rows through
  `F.linear`; the tables before then call it `packed`);
- `packed_bucketed`: `PackedLinear` as the engine runs it now: every count through one
  packed multiply, rounded up to `bucket_rows`.

A prefill's rows (batch x new tokens) and a fast-forward step's take a new count almost
every time. Reported: seconds of each round, and the process's RSS growth over the arm. The table goes
into the docs' block named after `--out`'s file.

    .venv/bin/python -m bench.probes.packed_shapes [--max-rows 400 --rounds 3]
    .venv/bin/python -m bench.probes.packed_shapes --min-rows 65 --max-rows 4096 \
        --stride 31 --out bench/results/packed_shapes/packed_shapes_prefill.json

Left out: bfloat16 weights, the decode-size speed of packing (bench.probes.engine_packed).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from art_langgraph.runtime.devices import matmul_flags
from bench.readme import alternate_arms, child_or_args, publish, results_dir

RESULTS = results_dir("packed_shapes") / "packed_shapes.json"
ARMS = ["plain", "packed_every_count", "packed_then_linear", "packed_bucketed"]


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


def child(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from art_langgraph.engine.packed_linear import PACKED_ROWS, pack_linears

    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    layers = [torch.nn.Linear(576, 1536, bias=False), torch.nn.Linear(1536, 576, bias=False)]
    if arm != "plain":
        for layer in layers:
            pack_linears(layer)

    def run(x: Any) -> Any:
        for layer in layers:
            if arm == "packed_every_count":
                x = torch.ops.mkldnn._linear_pointwise(x, layer._packed, None, "none", [], "")
            elif arm == "packed_then_linear" and len(x) > PACKED_ROWS:
                x = torch.nn.functional.linear(x, layer.weight)
            else:
                x = layer(x)
        return x

    start = _rss_mib()
    rounds = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        for m in range(args.min_rows, args.max_rows + 1, args.stride):
            run(torch.randn(m, 576))
        rounds.append(time.perf_counter() - t)
    return {"arm": arm, "rounds_s": rounds, "rss_growth_mib": _rss_mib() - start}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-rows", type=int, default=1)
    ap.add_argument("--max-rows", type=int, default=400)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = child_or_args(ap, ARMS, RESULTS, child)
    if args is None:
        return
    flags = [
        *("--min-rows", str(args.min_rows), "--max-rows", str(args.max_rows)),
        *("--stride", str(args.stride), "--rounds", str(args.rounds)),
    ]
    counts = f"every row count from {args.min_rows} to {args.max_rows}"
    if args.stride > 1:
        counts = f"row counts from {args.min_rows} to {args.max_rows} in steps of {args.stride}"
    runs = alternate_arms("bench.probes.packed_shapes", ARMS, 1, flags)
    base = min(runs["plain"][0]["rounds_s"][1:] or runs["plain"][0]["rounds_s"])
    lines = [
        f"host CPU flags: {matmul_flags()}; "
        f"Two of SmolLM2-135M's linear shapes (576 -> 1536 -> 576), float32, {counts}, "
        f"{args.rounds} rounds; each arm in its own process",
        "",
        "| multiply | first round s | later rounds s (best) | x plain | RSS growth MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for a in ARMS:
        r = runs[a][0]
        later = min(r["rounds_s"][1:] or r["rounds_s"])
        lines.append(
            f"| {a} | {r['rounds_s'][0]:.2f} | {later:.2f} | {later / base:.2f} | "
            f"{r['rss_growth_mib']:.0f} |"
        )
    publish(Path(args.out).stem, Path(args.out), lines, args, runs=runs)  # the docs' block


if __name__ == "__main__":
    main()
