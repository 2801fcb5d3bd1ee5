"""A decode step whose rows share their prompt's head, that head's KV held and read once for the batch.

Every row of an agent batch starts with the same system prompt and tool schemas (~700 of
~850-900 tokens on the bundled tasks), and the engine keeps a copy of that head's keys
and values in every row, reads each copy at every decode step, and counts every copy
against its running-KV budget (512 MiB: ~11 rows of 900 tokens of SmolLM2-135M in
float32). This probe times one decode step of the real model both ways, at several row
counts, in one process:

- **per row** (the engine today): each row's cache holds the whole context (growing cache,
  grouped-query SDPA, weights packed as the engine runs them);
- **shared head**: each row's cache holds only its own suffix, the head's KV is one
  (1, kv heads, P, dim) tensor per layer, and attention is the engine's
  (`engine/batch_head.py`: two parts merged by their log-sum-exps, the head's with every
  row's queries stacked as one long query per key/value head, so the head is read once,
  and the row's own suffix).

Both arms feed the same tokens; the shared arm's logits are checked against the per-row
arm's (max abs difference). `fits in 512 MiB` is how many rows of that shape the running
budget holds each way. What this does not do: the engine's batch (joins, retires, rows
of other heads), prefill, padding masks (the suffixes here are all one length).

    .venv/bin/python -m bench.probes.shared_prefix [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from art_langgraph.engine.batch_head import HEAD_ATTENTION
from bench.readme import publish, results_dir
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("shared_prefix") / "shared_prefix.json"
SHAPES = ((12, 850, 700), (32, 900, 700), (64, 900, 700), (128, 900, 700))
"""Rows x context, of which the shared head: rollouts' rows (12, 32) and an evaluation's."""
BUDGET = 512 * 2**20
"""The engine's running-KV budget on a CPU (`TorchEngineConfig.max_kv_bytes`'s cap)."""


def _steps(
    model: Any, cache: Any, nxt: Any, start: int, steps: int, **kw: Any
) -> tuple[float, Any]:
    import torch

    times, first = [], None
    for i in range(steps + 2):
        t0 = time.perf_counter()
        logits = model(
            input_ids=nxt,
            position_ids=torch.full((nxt.shape[0], 1), start + i),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **kw,
        ).logits
        times.append(time.perf_counter() - t0)
        first = logits if first is None else first
    return statistics.median(times[2:]) * 1000, first


def measure(model: Any, rows: int, context: int, head_len: int, steps: int) -> dict[str, Any]:
    """One shape, both arms: step ms, tokens/s, KV MiB, rows the budget holds, logit diff."""
    import torch

    from art_langgraph.engine.kv_cache import growing_cache

    c = model.config
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_token = c.num_hidden_layers * c.num_key_value_heads * dim * 2 * 4
    torch.manual_seed(0)
    prefix = torch.randint(0, 1000, (1, head_len))
    tail = torch.randint(0, 1000, (rows, context - head_len))
    ids = torch.cat([prefix.expand(rows, head_len), tail], 1)
    nxt = torch.randint(0, 1000, (rows, 1))
    model.set_attn_implementation("sdpa")
    cache = growing_cache(c)
    model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    full_ms, full = _steps(model, cache, nxt, context, steps)
    del cache
    # the head once, then each row's suffix after it
    from art_langgraph.engine.batch_head import BatchHead

    head_cache = growing_cache(c)
    model(input_ids=prefix, past_key_values=head_cache, use_cache=True, logits_to_keep=1)
    layers = [(x.keys.clone(), x.values.clone()) for x in head_cache.layers]
    head = BatchHead(tuple(prefix[0].tolist()), "base", layers)
    del head_cache
    model.set_attn_implementation(HEAD_ATTENTION)
    cache = growing_cache(c)
    pos = torch.arange(head_len, context).unsqueeze(0).expand(rows, -1)
    model(
        input_ids=ids[:, head_len:],
        position_ids=pos,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
        batch_head=head,
    )
    shared_ms, shared = _steps(model, cache, nxt, context, steps, batch_head=head)
    model.set_attn_implementation("sdpa")
    return {
        "rows": rows,
        "context": context,
        "head": head_len,
        "per_row_ms": full_ms,
        "shared_ms": shared_ms,
        "per_row_tok_s": rows / full_ms * 1000,
        "shared_tok_s": rows / shared_ms * 1000,
        "kv_mib_per_row": rows * context * per_token / 2**20,
        "kv_mib_shared": (head_len + rows * (context - head_len)) * per_token / 2**20,
        "fits_per_row": BUDGET // (context * per_token),
        "fits_shared": (BUDGET - head_len * per_token) // ((context - head_len) * per_token),
        "max_abs_logit_diff": float((full - shared).abs().max()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    from art_langgraph.engine.batch_head import register_head_attention
    from bench.probes.engine_packed import _set_packed, load_float32

    register_head_attention()
    model = load_float32(args.base_model)
    _set_packed(model, True)
    rows = []
    for b, t, h in SHAPES:
        rows.append(measure(model, b, t, h, args.steps))
        print(rows[-1], flush=True)
    lines = [
        f"{args.base_model}, float32, weights packed for oneDNN, one decode step (median of "
        f"{args.steps}), 2 cores, CPU flags {cpu_flags()}; both arms in one process\n",
        "| rows x context (shared head) | per row: step ms | tok/s | KV MiB | shared head: step ms "
        "| tok/s | KV MiB | tok/s ratio | rows in 512 MiB (per row, shared) | max logit diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rows']} x {r['context']} ({r['head']}) | {r['per_row_ms']:.0f} "
            f"| {r['per_row_tok_s']:.0f} | {r['kv_mib_per_row']:.0f} | {r['shared_ms']:.0f} "
            f"| {r['shared_tok_s']:.0f} | {r['kv_mib_shared']:.0f} "
            f"| {r['shared_tok_s'] / r['per_row_tok_s']:.2f}x "
            f"| {r['fits_per_row']}, {r['fits_shared']} | {r['max_abs_logit_diff']:.1e} |"
        )
    publish("shared_prefix", RESULTS, lines, args, rows=rows)


if __name__ == "__main__":
    main()
