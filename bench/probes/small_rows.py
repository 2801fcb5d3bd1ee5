"""A decode step of a few rows with packed multiplies at their own row count, against the
same rows padded to 8 (`engine/packed_linear.py`'s `SMALL_ROWS`).

`PackedLinear` runs each multiply at one of few row counts (`bucket_rows`), so oneDNN
builds few kernels. Rounding one row up to 8 turns the matrix-vector product of one
agent's decode step into a whole 8-row product. For 1 to 4 rows (and 8, where both arms
compute the same) this prefills the rows through the engine's KV cache and times decode
steps of SmolLM2-135M in float32, packed as the engine packs it, with the counts rounded
as `bucket_rows` rounds them ("own count") and with every count up to 8 rounded to 8
("padded to 8", the rule before), interleaved in one process on the same weights and
cache, each arm twice; the table reports the median step of each arm and the ratio, and
the largest difference in the logits between the arms (float32 rounding).

    .venv/bin/python -m bench.probes.small_rows [--steps 20] [--context 600]

Left out: more than 8 rows (rounded the same by both arms), prefill, bfloat16, GPUs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Callable

from art_langgraph.runtime.allocator import allocator_in_use
from bench.probes.engine_packed import _decode_ms, _set_packed, load_float32
from bench.readme import publish, results_dir
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("small_rows") / "small_rows.json"
ROWS = (1, 2, 3, 4, 8)


def padded_to_8(own: Callable[[int], int]) -> Callable[[int], int]:
    """The rule before `SMALL_ROWS` (`own` past 8 rows): up to 8 rows, 8."""
    return lambda m: 8 if m <= 8 else own(m)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--context", type=int, default=600)
    args = p.parse_args()
    import art_langgraph.engine.packed_linear as pl

    own_count = pl.bucket_rows
    before = padded_to_8(own_count)
    model = load_float32("smollm2-135m")
    _set_packed(model, True)
    rows_out = []
    for b in ROWS:
        arms: dict[str, list[float]] = {"own": [], "eight": []}
        ref, diff = None, 0.0
        for arm in ("eight", "own", "eight", "own"):
            pl.bucket_rows = own_count if arm == "own" else before  # packed_rows reads it
            ms, logits = _decode_ms(model, b, args.context, args.steps)
            arms[arm].append(ms)
            if ref is None:
                ref = logits
            else:
                diff = max(diff, float((logits - ref).abs().max()))
        pl.bucket_rows = own_count
        own, eight = statistics.fmean(arms["own"]), statistics.fmean(arms["eight"])
        rows_out.append(
            {
                "rows": b,
                "bucket": own_count(b),
                "context": args.context,
                "padded_ms": eight,
                "own_ms": own,
                "speedup": eight / own,
                "max_logit_diff": diff,
            }
        )
        print(rows_out[-1], flush=True)
    head = (
        f"smollm2-135m, float32, packed, one decode step (median of {args.steps}, each arm "
        f"twice, interleaved), {os.cpu_count()} cores ({platform.machine()}, CPU flags: "
        f"{cpu_flags()}), allocator {allocator_in_use()}\n\n"
        "| rows x context | multiplied at | padded to 8 (ms/step) | own count (ms/step) | "
        "speed-up | max logit diff |\n|---|---|---|---|---|---|"
    )
    lines = [head] + [
        f"| {r['rows']} x {r['context']} | {r['bucket']} rows | {r['padded_ms']:.1f} | "
        f"{r['own_ms']:.1f} | {r['speedup']:.2f}x | {r['max_logit_diff']:.0e} |"
        for r in rows_out
    ]
    publish("small_rows", RESULTS, lines, args, rows=rows_out)


if __name__ == "__main__":
    main()
