"""The engine's KV cache: transformers' concatenating `DynamicCache` against ours, which
grows in place (`engine/kv_cache.py`), on the real preset (SmolLM2-135M-Instruct).

Each variant runs in a child process of its own (so each peak RSS is its own): 36
concurrent requests with a shared ~520-token prompt prefix (an agent's system prompt and
tools) and their own question, 256 tokens each with `ignore_eos`, the engine's default
fp32 on the CPU. One warm-up round of 4 requests first. Reported: wall time, decode
steps per second, peak RSS, and whether the greedy tokens are identical.

    .venv/bin/python -m bench.probes.engine_kv [--rows 36 --tokens 256]

Left out: the HTTP server (see bench.serve_throughput), GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("engine_kv") / "engine_kv.json"
VARIANTS = ["dynamic_cache", "growing_cache"]
SYSTEM = (
    "You are an agent that solves the user's task with the tools you have. "
    "Call tools as needed, then call complete_task with the final answer. " * 12
)


def child(variant: str, rows: int, tokens: int) -> dict[str, Any]:
    import torch

    from art_langgraph.engine import SamplingParams, TorchEngine
    from art_langgraph.engine import torch_engine as te

    if variant == "dynamic_cache":
        from transformers import DynamicCache

        te.growing_cache = lambda config: DynamicCache(config=config)  # type: ignore[assignment]
    torch.manual_seed(0)
    engine = TorchEngine.from_pretrained("smollm2-135m")
    tok = engine.tokenizer

    def prompt(i: int) -> list[int]:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Question {i}: what is {i} plus {i * 7}?"},
        ]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tok.encode(text, add_special_tokens=False))

    greedy = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    async def run(n: int) -> list[list[int]]:
        outs = await asyncio.gather(*(engine.generate(prompt(i), greedy) for i in range(n)))
        return [o.completion_token_ids for o in outs]

    asyncio.run(run(4))
    steps0, t0 = engine.steps, time.perf_counter()
    out = asyncio.run(run(rows))
    wall = time.perf_counter() - t0
    steps = engine.steps - steps0
    engine.close_sync()
    return {
        "variant": variant,
        "wall_s": wall,
        "decode_steps": steps,
        "steps_per_s": steps / wall,
        "prompt_tokens": len(prompt(0)),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tokens": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=36)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--only", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.only:
        print(json.dumps(child(args.only, args.rows, args.tokens)))
        return
    import torch

    rows = []
    for v in VARIANTS:
        cmd = [sys.executable, "-m", "bench.probes.engine_kv", "--only", v]
        cmd += ["--rows", str(args.rows), "--tokens", str(args.tokens)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]
    same = all(r["tokens"] == base["tokens"] for r in rows)
    lines = [
        f"machine: {torch.get_num_threads()} torch threads, cpu, torch {torch.__version__}; "
        f"SmolLM2-135M-Instruct fp32; {args.rows} concurrent requests, {rows[0]['prompt_tokens']}"
        f"-token prompts sharing a prefix, {args.tokens} greedy tokens each (ignore_eos)",
        "",
        "| KV cache | wall s | decode steps/s | × dynamic_cache | peak RSS MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['wall_s']:.1f} | {r['steps_per_s']:.2f} | "
            f"{base['wall_s'] / r['wall_s']:.2f}x faster | {r['peak_rss_mib']:.0f} |"
        )
    lines.append("")
    lines.append(f"Greedy tokens identical across variants: {'yes' if same else 'NO'}.")
    table = "\n".join(lines)
    print(table)
    for r in rows:
        r.pop("tokens")  # compared above; 36 x 256 ids per variant would bloat the JSON
    write_results(args.out, {"rows": rows, "identical_tokens": same})
    if args.out == RESULTS:
        update_docs("engine_kv", table)


if __name__ == "__main__":
    main()
