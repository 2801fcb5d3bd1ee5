"""Where one BFCL evaluation's time goes, against the machine's limits: is issue 53's time
target (a whole run in 25 min on 2 AVX2 cores, 15 on AMX) within reach of a faster engine?

Runs the example's own evaluation (`examples.bfcl.app.Run.evaluate`: the fixed held-out
sample, 40 items a category, greedy and sampled at T=1, irrelevance also under "auto") on
the untrained model, with the torch engine's prefill and decode timed, and sets each
against its floor, measured on the same host just before, in child processes
(`bench.probes.decode_roofline`'s helpers):

- **prefill**: the prompt tokens the engine computed (not served from its prefix cache,
  nor shared within an admission batch), 2 FLOPs a weight a token, at the rate of a large
  matmul of the model's shapes;
- **decode**: each step's bytes (every weight once, each row's real keys and values once)
  at the machine's read bandwidth, or its FLOPs (2 a weight a position: a row runs more
  than one position where grammar-forced tokens run ahead) at that matmul rate, whichever
  is longer.

"engine at its floors" is the evaluation's time were both at their floors and nothing else
took time; "2 evaluations (a run's)" at the floors is what a run's untrained and final evaluations
would take at the least (the final one decodes fewer tokens, so it is an upper bound for
that one), before any rollout or training.

    .venv/bin/python -m bench.probes.bfcl_eval_cost [--limit N] [--tag NAME]

Needs `.venv-bfcl` (./scripts/setup-bfcl.sh). Left out: rollouts and training (the run's
`result.json` times them), trained models, bfloat16, the vLLM engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.readme import ROOT, publish, results_dir
from bench.trainer_roofline import cpu_flags


class EngineTimer:
    """Wraps a torch engine's `_prefill` and `_decode`: their seconds, each decode step's
    rows and real KV tokens (the batch mask's ones), and the token positions the prefill
    forwards computed (rows x width, left padding included) against their real tokens."""

    def __init__(self, engine: Any) -> None:
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.steps: list[tuple[int, int]] = []
        self.decode_positions: list[int] = []
        self.prefill_positions = 0
        self.prefill_real = 0
        self.prefill_forwards = 0
        prefill, decode, forward = engine._prefill, engine._decode, engine._forward
        self._in_prefill = False

        def counted_forward(ids: Any, mask: Any, *a: Any, **k: Any) -> Any:
            if self._in_prefill:
                self.prefill_forwards += 1
                self.prefill_positions += ids.numel()
                self.prefill_real += int(mask[:, -ids.shape[1] :].sum())
            else:  # a decode step: one position a row, more where forced tokens run ahead
                self.decode_positions[-1] += ids.numel()
            return forward(ids, mask, *a, **k)

        def timed_prefill(new: list[Any]) -> None:
            t = time.perf_counter()
            self._in_prefill = True
            try:
                prefill(new)
            finally:
                self._in_prefill = False
            self.prefill_s += time.perf_counter() - t

        def timed_decode() -> None:
            batch = engine._batch
            head = batch.head.length if batch.head is not None else 0
            rows = batch.active
            kv = int(batch.mask.sum()) + head if batch.mask is not None else 0
            self.decode_positions.append(0)
            t = time.perf_counter()
            decode()
            self.decode_s += time.perf_counter() - t
            self.steps.append((rows, kv))

        engine._prefill = timed_prefill
        engine._decode = timed_decode
        engine._forward = counted_forward


def _limits(hidden: int, inter: int) -> tuple[float, float]:
    """The machine's read bandwidth (GB/s) and float32 matmul rate (GFLOP/s), each the best
    of three child processes (`bench.probes.decode_roofline`'s measures), before this
    process starts any engine thread: in-process they read up to 2.7x low."""
    code = (
        "import torch\nfrom bench.probes.decode_roofline import _matmul_gflops, _read_gbs\n"
        f"print(_read_gbs(torch), _matmul_gflops(torch, {hidden}, {inter}))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
        )
        for _ in range(3)
    ]
    pairs = [tuple(map(float, r.stdout.split())) for r in runs]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


async def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import art_langgraph as art
    from art_langgraph.engine.budgets import kv_token_bytes
    from examples.bfcl.app import Run, parser, trainable_model

    argv = ["--out", args.out] + (["--eval-limit", str(args.limit)] if args.limit else [])
    ex = parser().parse_args(argv)
    from transformers import AutoConfig

    from art_langgraph.presets import resolve_preset

    c = AutoConfig.from_pretrained(resolve_preset(ex.base_model))
    bw, gflops = _limits(c.hidden_size, c.intermediate_size)
    run = Run(ex)
    try:
        model = trainable_model(ex)
        backend = art.LocalBackend(path=f"{args.out}/art")
        await model.register(backend)
        engine: Any = backend.engine  # the torch engine: its methods timed, its counters read
        torch_model = engine.base_model
        linear = sum(
            m.weight.numel() for m in torch_model.modules() if isinstance(m, torch.nn.Linear)
        )
        token_bytes = kv_token_bytes(c, torch_model.dtype)
        timer = EngineTimer(engine)
        before = engine.metrics()
        shared0 = engine.shared_prefix_tokens
        result = await run.evaluate(model, "untrained")
        after = engine.metrics()
    finally:
        run.checker.close()
    prompt = after.prompt_tokens - before.prompt_tokens
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    shared = engine.shared_prefix_tokens - shared0
    generated = after.generation_tokens - before.generation_tokens
    computed = prompt - hits - shared
    prefill_floor = computed * 2 * linear / (gflops * 1e9)
    decode_floor = sum(
        max((linear * 4 + kv * token_bytes) / (bw * 1e9), 2 * linear * n / (gflops * 1e9))
        for (_, kv), n in zip(timer.steps, timer.decode_positions, strict=True)
    )
    episodes = sum(map(len, result["per_item"].values()))
    return {
        "episodes": episodes,
        "evaluation_s": result["seconds"],
        "prompt_tokens": prompt,
        "prompt_tokens_computed": computed,
        "generated_tokens": generated,
        "prefill_s": timer.prefill_s,
        "prefill_forwards": timer.prefill_forwards,
        "prefill_positions": timer.prefill_positions,
        "prefill_real_tokens": timer.prefill_real,
        "prefill_floor_s": prefill_floor,
        "decode_s": timer.decode_s,
        "decode_floor_s": decode_floor,
        "decode_steps": len(timer.steps),
        "decode_positions": sum(timer.decode_positions),
        "mean_rows": sum(r for r, _ in timer.steps) / max(1, len(timer.steps)),
        "read_gbs": bw,
        "matmul_gflops": gflops,
        "flags": cpu_flags(),
        "dtype": str(torch_model.dtype).removeprefix("torch."),
        "cores": os.cpu_count(),
        "accuracy": {k: sum(v.values()) / len(v) for k, v in result["per_item"].items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=int, default=None, help="items a category (smoke runs)")
    p.add_argument("--tag", default="", help="a suffix for the result's file name")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.out = tmp
        r = asyncio.run(_evaluate(args))
    args.out = "<temporary>"
    floors = r["prefill_floor_s"] + r["decode_floor_s"]
    m = 60.0
    lines = [
        f"One untrained BFCL evaluation of the example ({r['episodes']} episodes), smollm2-135m, "
        f"{r['dtype']}, {r['cores']} cores, CPU flags {r['flags']}; read bandwidth {r['read_gbs']:.1f} GB/s, "
        f"float32 matmul {r['matmul_gflops']:.0f} GFLOP/s\n",
        "| part | measured | its floor | measured / floor |",
        "|---|---:|---:|---:|",
        f"| prefill ({r['prompt_tokens_computed']:,} of {r['prompt_tokens']:,} prompt tokens "
        f"computed in {r['prefill_forwards']:,} forwards of {r['prefill_positions']:,} "
        f"positions, padding included) | {r['prefill_s'] / m:.1f} min | {r['prefill_floor_s'] / m:.1f} min "
        f"| {r['prefill_s'] / r['prefill_floor_s']:.1f}x |",
        f"| decode ({r['generated_tokens']:,} tokens, {r['decode_steps']:,} steps of "
        f"{r['mean_rows']:.1f} rows, {r['decode_positions']:,} positions) "
        f"| {r['decode_s'] / m:.1f} min "
        f"| {r['decode_floor_s'] / m:.1f} min | {r['decode_s'] / r['decode_floor_s']:.1f}x |",
        f"| the evaluation (wall) | {r['evaluation_s'] / m:.1f} min | {floors / m:.1f} min "
        f"(engine at its floors) | {r['evaluation_s'] / floors:.1f}x |",
        f"| 2 evaluations (a run's) | {2 * r['evaluation_s'] / m:.1f} min | "
        f"{2 * floors / m:.1f} min | |",
    ]
    name = "bfcl_eval_cost" + (f"_{args.tag}" if args.tag else "")
    publish(name, results_dir("bfcl_eval_cost") / f"{name}.json", lines, args, **r)


if __name__ == "__main__":
    main()
