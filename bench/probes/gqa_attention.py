"""The engine's attention with several query tokens under a mask: transformers' SDPA path
(every key/value head copied out to its query heads, `repeat_kv`) against
`engine/gqa_attention.py` (the grouped heads handed to torch's SDPA as they are), and the
same two ways of appending zero rows a packed multiply is rounded up with (`F.pad`
against `torch.cat`, `engine/packed_linear.py`). Side by side in one process, float32,
median of `--repeats`, `--threads` threads (the engine's), with their outputs checked equal.

The shapes are SmolLM2-135M's (9 query heads, 3 key/value heads of 64) at the batch sizes
and context lengths of an agent's evaluation: 1 query token (a plain decode step, which
transformers already folds), 4 and 16 (fast-forward steps and short prefills over a
prefix-cache hit); and the row counts of a decode step and of prefills.

    .venv/bin/python -m bench.probes.gqa_attention [--repeats 30] [--threads 2]

Left out: a whole engine run (bench.agent_rollouts, bench.time_to_rise), bfloat16.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from art_langgraph.engine.gqa_attention import gqa_attention
from art_langgraph.engine.packed_linear import bucket_rows
from art_langgraph.runtime.devices import matmul_flags
from bench.readme import publish, results_dir

RESULTS = results_dir("gqa_attention") / "gqa_attention.json"
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
ATTENTION = [(32, 800, 1), (32, 800, 4), (32, 800, 16), (8, 1500, 4), (64, 400, 4)]
"""(rows, keys, query tokens) of an attention call."""
PADS = [(5, 576), (27, 1536), (300, 576), (1500, 576), (1500, 1536), (3000, 1536)]
"""(rows, width) of an input a packed multiply rounds up to `bucket_rows(rows)`."""


class _Attn(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _attention(b: int, s: int, q: int, repeats: int) -> dict[str, float]:
    """transformers' SDPA and ours on one call's shapes, checked equal."""
    module = _Attn()
    query = torch.randn(b, HEADS, q, HEAD_DIM)
    key, value = torch.randn(b, KV_HEADS, s, HEAD_DIM), torch.randn(b, KV_HEADS, s, HEAD_DIM)
    mask = torch.ones(b, 1, q, s, dtype=torch.bool).tril(s - q)
    theirs = functools.partial(sdpa_attention_forward, module, query, key, value, mask)
    ours = functools.partial(gqa_attention, module, query, key, value, mask)
    torch.testing.assert_close(ours()[0], theirs()[0], rtol=0, atol=1e-5)
    return {"rows": b, "keys": s, "q": q, "transformers_ms": _median_ms(theirs, repeats),
            "grouped_ms": _median_ms(ours, repeats)}  # fmt: skip


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    return F.pad(x, (0, 0, 0, rows - len(x)))


def _cat(x: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([x, x.new_zeros(rows - len(x), x.shape[1])])


def _padding(m: int, width: int, repeats: int) -> dict[str, float]:
    """Both ways of appending zero rows to an (m, width) input, checked equal."""
    x, rows = torch.randn(m, width), bucket_rows(m)
    assert torch.equal(_pad(x, rows), _cat(x, rows))
    return {"rows": m, "bucket": rows, "width": width,
            "pad_ms": _median_ms(functools.partial(_pad, x, rows), repeats),
            "cat_ms": _median_ms(functools.partial(_cat, x, rows), repeats)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    attention = [_attention(b, s, q, args.repeats) for b, s, q in ATTENTION]
    padding = [_padding(m, w, args.repeats * 5) for m, w in PADS]
    lines = [
        f"float32, {args.threads} threads, median of {args.repeats}; torch {torch.__version__}; "
        f"CPU flags: {matmul_flags()}",
        "",
        "| rows x keys, query tokens | transformers' SDPA ms | grouped heads ms | speed-up |",
        "|---|---:|---:|---:|",
    ]
    for r in attention:
        a, c = r["transformers_ms"], r["grouped_ms"]
        lines.append(f"| {r['rows']} x {r['keys']}, {r['q']} | {a:.2f} | {c:.2f} | {a / c:.2f}x |")
    lines += ["", "| rows -> bucket, width | F.pad ms | torch.cat ms | speed-up |"]
    lines.append("|---|---:|---:|---:|")
    for r in padding:
        a, c = r["pad_ms"], r["cat_ms"]
        lines.append(
            f"| {r['rows']} -> {r['bucket']}, {r['width']} | {a:.3f} | {c:.3f} | {a / c:.2f}x |"
        )
    publish("gqa_attention", RESULTS, lines, args, attention=attention, padding=padding)


if __name__ == "__main__":
    main()
