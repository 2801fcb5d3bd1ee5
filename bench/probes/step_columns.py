"""What one more column costs a decode step: the price `forced_width` weighs.

A decode step in which rows feed grammar-forced tokens (`engine/fast_forward.py`) gives
every row the step's columns, pads where a row's run is shorter. This times decode steps
of SmolLM2-135M in float32, packed as the engine packs it, through the engine's KV cache,
at a few row counts and 1 to 8 columns a row (the logits of every column kept, as a
forced step keeps them), each shape twice in alternating rounds in one process, and fits
each row count's step time as a fixed cost plus a cost a position (least squares). From
those, a column pays for itself when the real tokens it carries are at least
`column / (fixed + rows x a position)` of the rows: the share printed last.

    .venv/bin/python -m bench.probes.step_columns [--steps 8] [--context 600]

Left out: the grammar's own work (matchers, masks), prefill, bfloat16, GPUs; the fit is a
line through shapes whose packed multiplies round to different row counts.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

from bench.probes.engine_packed import _decode_ms, _set_packed, load_float32
from bench.readme import publish, results_dir
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("step_columns") / "step_columns.json"
ROWS = (4, 12)
COLUMNS = (1, 2, 3, 4, 6, 8)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--context", type=int, default=600)
    args = p.parse_args()
    import torch

    model = load_float32("smollm2-135m")
    _set_packed(model, True)
    out = []
    with torch.no_grad():
        for rows in ROWS:
            ms: dict[int, list[float]] = {q: [] for q in COLUMNS}
            for _ in range(2):
                for q in COLUMNS:
                    ms[q].append(_decode_ms(model, rows, args.context, args.steps, q)[0])
            means = {q: statistics.fmean(v) for q, v in ms.items()}
            per_pos, fixed = statistics.linear_regression(
                [rows * q for q in means], list(means.values())
            )
            share = rows * per_pos / (fixed + rows * per_pos)
            out.append(
                {
                    "rows": rows,
                    "ms": means,
                    "fixed_ms": fixed,
                    "per_position_ms": per_pos,
                    "column_pays_at_share": share,
                }
            )
            print(out[-1], flush=True)
    head = (
        f"smollm2-135m, float32, packed, one decode step of rows x {args.context} tokens "
        f"feeding 1-8 columns a row (median of {args.steps}, each shape twice, alternating), "
        f"{os.cpu_count()} cores ({platform.machine()}, CPU flags: {cpu_flags()})\n\n"
        "| rows | " + " | ".join(f"{q} col. (ms)" for q in COLUMNS) + " | fixed (ms) | "
        "a position (ms) | a column pays when it carries |\n|---|" + "---|" * (len(COLUMNS) + 3)
    )
    lines = [head] + [
        f"| {r['rows']} | "
        + " | ".join(f"{r['ms'][q]:.0f}" for q in COLUMNS)
        + f" | {r['fixed_ms']:.0f} | {r['per_position_ms']:.2f} | "
        f"{r['column_pays_at_share']:.0%} of the rows |"
        for r in out
    ]
    publish("step_columns", RESULTS, lines, args, rows=out)


if __name__ == "__main__":
    main()
