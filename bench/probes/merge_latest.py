"""Does the torch engine's merged copy of the weights pay? `TorchEngineConfig.merge_latest` on and off.

What it measures, on one preset (default smollm2-135m) on this machine: one adapter (a
real, non-zero LoRA: one SFT step's worth of random init is zero, so its B matrices are
filled from a fixed seed) is loaded, then N concurrent completions of M tokens are
served with it (`ignore_eos`), for two engines built alike but for `merge_latest`:

- `merged`: batches that use only the latest adapter run on a second, merged copy of the
  weights (plain Linear layers);
- `peft`: every batch runs peft's per-layer LoRA path over the one base copy.

Each engine runs in a process of its own, so its peak RSS is its own; the two alternate
`--repeats` times (noise falls on both). Reported: tokens/s, p50 of the request wall
time, the adapter load time (which for `merged` includes the merge), peak RSS.

Run: .venv/bin/python -m bench.probes.merge_latest [--base-model smollm2-135m --requests 16 \
    --max-tokens 32]

Left out: several adapters at once (then both paths run peft's), GPUs, vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("merge_latest") / "merge_latest.json"


def _adapter(engine: Any, folder: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    import art_langgraph as art
    from art_langgraph.engine.shared_base import model_over

    mc = art.ModelConfig(lora_r=8, lora_alpha=16)
    lora = LoraConfig(
        r=8, lora_alpha=16, target_modules=list(mc.target_modules), task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model_over(engine.shared_base.tensors, engine.base_model), lora)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
    peft_model.save_pretrained(folder)


async def _serve(args: argparse.Namespace, merged: bool) -> dict[str, Any]:
    from art_langgraph.engine import TorchEngine, TorchEngineConfig
    from art_langgraph.engine.base import SamplingParams

    engine = TorchEngine.from_pretrained(args.base_model, TorchEngineConfig(merge_latest=merged))
    with tempfile.TemporaryDirectory() as tmp:
        _adapter(engine, Path(tmp))
        t0 = time.perf_counter()
        await engine.load_adapter("a", tmp)
        load_s = time.perf_counter() - t0
    ids = [
        engine.tokenizer.encode(f"Question {i}: name a country and its capital.")
        for i in range(args.requests)
    ]
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True)

    async def one(p: list[int]) -> float:
        t = time.perf_counter()
        r = await engine.generate(p, sp, adapter="a")
        assert len(r.completion_token_ids) == args.max_tokens
        return time.perf_counter() - t

    await asyncio.gather(*(one(p) for p in ids[:4]))  # warm-up
    runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        lat = await asyncio.gather(*(one(p) for p in ids))
        wall = time.perf_counter() - t0
        runs.append(
            {"tok_s": args.requests * args.max_tokens / wall, "p50_s": statistics.median(lat)}
        )
    await engine.close()
    return {
        "variant": "merged" if merged else "peft",
        "load_s": load_s,
        "tok_s": statistics.median(r["tok_s"] for r in runs),
        "p50_s": statistics.median(r["p50_s"] for r in runs),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", choices=["merged", "peft"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_serve(args, args.child == "merged"))))
        return
    rows: dict[str, dict[str, Any]] = {}
    for variant in ("merged", "peft"):
        cmd = [
            sys.executable,
            "-m",
            "bench.probes.merge_latest",
            "--child",
            variant,
            f"--base-model={args.base_model}",
            f"--requests={args.requests}",
            f"--max-tokens={args.max_tokens}",
            f"--repeats={args.repeats}",
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        print(variant, rows[variant], file=sys.stderr)
    base = rows["peft"]
    lines = [
        f"{args.base_model}, one adapter, {args.requests} concurrent × {args.max_tokens} tokens, "
        f"median of {args.repeats}; each engine in its own process",
        "",
        "| engine | tok/s | × peft | p50 s | adapter load s | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| `merge_latest={v == 'merged'}` | {r['tok_s']:.0f} | {r['tok_s'] / base['tok_s']:.2f} | "
            f"{r['p50_s']:.2f} | {r['load_s']:.2f} | {r['peak_rss_mib']:.0f} |"
            for v, r in rows.items()
        ),
    ]
    text = "\n".join(lines)
    print(text)
    write_results(
        RESULTS,
        {"benchmark": "merge_latest", "settings": vars(args), "rows": rows, "markdown": text},
    )
    if update_docs("merge_latest", text):
        print("updated docs/benchmarks.md")


if __name__ == "__main__":
    main()
