"""Rounding a packed multiply's rows up with zero rows: `F.pad` against `torch.cat`.

`PackedLinear` runs every multiply at one of few row counts (`bucket_rows`), so an input
of M rows gets zero rows appended before oneDNN sees it. A py-spy profile of a BFCL
held-out evaluation put `F.pad` (constant mode) at 8.5% of the engine thread
(docs/bfcl.md#where-a-runs-time-goes). This times both ways of appending, side by side in
one process, at the row counts and widths the engine meets (a decode step's few rows, a
prefill's hundreds to thousands; SmolLM2-135M's 576 and 1,536 wide inputs), float32,
median of `--repeats`, with `--threads` threads (the engine's), and checks they give the
same tensor.

    .venv/bin/python -m bench.probes.pad_rows [--repeats 150] [--threads 2]

Left out: the multiply itself (bench.probes.packed_shapes), a whole engine run, bfloat16.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from art_langgraph.engine.packed_linear import bucket_rows
from art_langgraph.runtime.devices import matmul_flags
from bench.readme import publish, results_dir

RESULTS = results_dir("pad_rows") / "pad_rows.json"
SHAPES = [(5, 576), (27, 1536), (300, 576), (1500, 576), (1500, 1536), (3000, 1536)]
"""(rows, width) of an input a packed multiply rounds up to `bucket_rows(rows)`."""


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    return F.pad(x, (0, 0, 0, rows - len(x)))


def _cat(x: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([x, x.new_zeros(rows - len(x), x.shape[1])])


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=150)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines = [
        f"float32, {args.threads} threads, median of {args.repeats}; torch {torch.__version__}; "
        f"CPU flags: {matmul_flags()}",
        "",
        "| rows -> bucket, width | F.pad ms | torch.cat ms | speed-up |",
        "|---|---:|---:|---:|",
    ]
    rows_out = []
    for m, width in SHAPES:
        x, rows = torch.randn(m, width), bucket_rows(m)
        assert torch.equal(_pad(x, rows), _cat(x, rows))
        pad = _median_ms(functools.partial(_pad, x, rows), args.repeats)
        cat = _median_ms(functools.partial(_cat, x, rows), args.repeats)
        rows_out.append({"rows": m, "bucket": rows, "width": width, "pad_ms": pad, "cat_ms": cat})
        lines.append(f"| {m} -> {rows}, {width} | {pad:.3f} | {cat:.3f} | {pad / cat:.2f}x |")
    publish("pad_rows", RESULTS, lines, args, rows=rows_out)


if __name__ == "__main__":
    main()
