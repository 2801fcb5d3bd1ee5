"""Prepacked oneDNN weights against `F.linear` in the engine's forward, side by side.

For each batch shape (rows x context tokens) it prefills the rows through the engine's own
KV cache (`engine/kv_cache.py`) and times decode steps (one token a row, the mask and
positions as the engine passes them) with the model's linear layers plain, then packed
(`engine/packed_linear.py`), then plain again, in one process on the same weights and
cache; the table reports the median of each arm and the ratio. It also reports the
largest difference in the decode logits between the arms (float32 rounding).

    .venv/bin/python -m bench.probes.engine_packed [--base-model smollm2-135m] [--steps 20]

Left out: GPUs (no packing there), whole rollouts (bench.agent_rollouts has those).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

from art_langgraph.runtime.allocator import allocator_in_use, reexec_with_tcmalloc
from bench.readme import publish, results_dir
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("engine_packed") / "engine_packed.json"
SHAPES = ((1, 600), (8, 700), (16, 300), (32, 900))


def _decode_ms(
    model: Any, rows: int, context: int, steps: int, columns: int = 1
) -> tuple[float, Any]:
    """The median decode step of `rows` rows prefilled with `context` tokens through the
    engine's KV cache, each step feeding `columns` tokens a row (grammar-forced tokens run
    ahead) and keeping their logits; returns it (ms) and the first step's logits."""
    import torch

    from art_langgraph.engine.kv_cache import growing_cache

    torch.manual_seed(0)
    cache = growing_cache(model.config)
    ids = torch.randint(0, 1000, (rows, context))
    mask = torch.ones(rows, context, dtype=torch.long)
    model(
        input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1
    )
    nxt = torch.randint(0, 1000, (rows, columns))
    times, logits = [], None
    for i in range(steps + 2):
        mask = torch.cat([mask, torch.ones(rows, columns, dtype=torch.long)], 1)
        pos = torch.arange(context + i * columns, context + (i + 1) * columns)
        t0 = time.perf_counter()
        out = model(
            input_ids=nxt,
            attention_mask=mask,
            position_ids=pos.expand(rows, columns),
            past_key_values=cache,
            cache_position=pos,
            use_cache=True,
            logits_to_keep=columns,
        ).logits
        times.append(time.perf_counter() - t0)
        logits = out if logits is None else logits
    return statistics.median(times[2:]) * 1000, logits


def load_float32(base_model: str) -> Any:
    """`base_model` in float32 for decode timing, in a process set up as the engine's is:
    tcmalloc (re-executing this process if need be), grouped-query SDPA, no gradients."""
    reexec_with_tcmalloc()  # as art-mcp runs (art_langgraph/runtime/allocator.py)
    os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")  # as the engine sets it
    import torch
    from transformers import AutoModelForCausalLM

    from art_langgraph.presets import resolve_preset

    torch.set_grad_enabled(False)
    return AutoModelForCausalLM.from_pretrained(
        resolve_preset(base_model, None), dtype=torch.float32
    ).eval()


def _set_packed(model: Any, on: bool) -> None:
    from art_langgraph.engine.packed_linear import PackedLinear, pack_linears

    if on:
        pack_linears(model)
        return
    for m in model.modules():
        if isinstance(m, PackedLinear):
            m._packed = None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    model = load_float32(args.base_model)
    rows = []
    for b, t in SHAPES:
        arms: dict[str, list[float]] = {"plain": [], "packed": []}
        diff = 0.0
        for arm in ("plain", "packed", "plain", "packed"):
            _set_packed(model, arm == "packed")
            ms, logits = _decode_ms(model, b, t, args.steps)
            arms[arm].append(ms)
            if arm == "plain":
                ref = logits
            else:
                diff = max(diff, float((logits - ref).abs().max()))
        plain, packed = statistics.fmean(arms["plain"]), statistics.fmean(arms["packed"])
        rows.append(
            {
                "rows": b,
                "context": t,
                "plain_ms": plain,
                "packed_ms": packed,
                "speedup": plain / packed,
                "max_logit_diff": diff,
            }
        )
        print(rows[-1], flush=True)
    head = (
        f"{args.base_model}, float32, one decode step (median of {args.steps}, each arm twice, "
        f"interleaved), 2 cores ({platform.machine()}, CPU flags: {cpu_flags()}), "
        f"allocator {allocator_in_use()}\n\n"
        "| rows x context | F.linear (ms/step) | packed (ms/step) | speed-up | max logit diff |\n"
        "|---|---|---|---|---|"
    )
    lines = [head] + [
        f"| {r['rows']} x {r['context']} | {r['plain_ms']:.1f} | {r['packed_ms']:.1f} | "
        f"{r['speedup']:.2f}x | {r['max_logit_diff']:.0e} |"
        for r in rows
    ]
    publish("engine_packed", RESULTS, lines, args, rows=rows)


if __name__ == "__main__":
    main()
