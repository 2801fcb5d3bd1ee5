"""One GRPO trainer step on the real preset (SmolLM2-135M-Instruct): what gathering logits saves.

Variants, each in a child process of its own (so each peak RSS is its own), on the same
16 sequences of ~400 tokens (a 300-token prompt, a 100-token completion trained, random
advantages, sampler logprobs from the fp32 model):

- `full_logits_fp32`: the trainer as it was: logits for every position, (R, L, V), then
  log-softmax and a gather (reproduced here by overriding `_logprobs`);
- `gathered_fp32`: logits only at the trained positions, in chunks (the trainer now);
- `gathered_bf16_autocast`: the same under bf16 autocast (`ModelConfig(compute_dtype=
  "bfloat16")`); its sampler/trainer mismatch against the fp32 sampler logprobs is reported;
- `gathered_bf16_checkpointed`: the same with gradient checkpointing (activations
  recomputed in the backward pass): the memory a CPU training run can afford.

Each child runs `--warmup` untimed steps, then `--steps` timed ones (median, best).

    .venv/bin/python -m bench.probes.trainer_step [--steps 2 --warmup 1]

Left out: the rollouts (see bench.rl_step), GPUs.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.readme import results_dir

RESULTS = results_dir("trainer_step") / "trainer_step.json"
VARIANTS = [
    "full_logits_fp32",
    "gathered_fp32",
    "gathered_bf16_autocast",
    "gathered_bf16_checkpointed",
]


def _sequences(tok_vocab: int, n: int, prompt: int, completion: int, seed: int) -> list[Any]:
    import torch

    from art_langgraph.training.tensorize import TrainSequence

    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(n):
        ids = torch.randint(100, tok_vocab, (prompt + completion,), generator=g).tolist()
        mask = [False] * prompt + [True] * completion
        lps = [float("nan")] * prompt + [-2.0] * completion
        adv = float(torch.randn((), generator=g))
        seqs.append(TrainSequence(ids, mask, lps, adv))
    return seqs


def child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from art_langgraph.presets import resolve_preset
    from art_langgraph.training import ModelConfig, TrainConfig
    from art_langgraph.training.trainer import LoRATrainer

    torch.manual_seed(0)
    path = resolve_preset("smollm2-135m")
    cfg = ModelConfig(
        compute_dtype="bfloat16" if "bf16" in variant else "auto",
        gradient_checkpointing="checkpointed" in variant,
    )
    trainer = LoRATrainer(path, cfg, "cpu")
    if variant == "full_logits_fp32":

        def full(mb: Any, target_mask: torch.Tensor) -> torch.Tensor:
            out = trainer.model(
                input_ids=mb.input_ids,
                attention_mask=mb.attention_mask,
                position_ids=mb.position_ids,
                use_cache=False,
            )
            logits = out.logits[:, :-1].float()  # (R, L-1, V)
            lp = torch.log_softmax(logits, -1).gather(-1, mb.input_ids[:, 1:].unsqueeze(-1))
            return torch.nn.functional.pad(lp.squeeze(-1), (1, 0))[target_mask]

        trainer._logprobs = full  # type: ignore[method-assign]
    seqs = _sequences(
        len(trainer.tokenizer), args.sequences, args.prompt_tokens, args.completion_tokens, 0
    )
    # Sampler logprobs: the fp32 model's own (what an fp32 engine reports), so the mismatch
    # row shows what bf16 autocast adds.
    from art_langgraph.training.tensorize import micro_batches

    def all_logprobs(dtype: torch.dtype) -> list[float]:
        trainer.compute_dtype, saved = dtype, trainer.compute_dtype
        out: list[float] = []
        with torch.no_grad():
            for mb in micro_batches(
                seqs, row_length=len(seqs[0]), micro_batch_tokens=16384, pack=False
            ):
                out += trainer._logprobs(mb, mb.target_mask).tolist()
        trainer.compute_dtype = saved
        return out

    mismatch = None
    if variant == "gathered_bf16_autocast":
        diffs = [
            abs(a - b)
            for a, b in zip(all_logprobs(trainer.dtype), all_logprobs(torch.bfloat16), strict=True)
        ]
        mismatch = {"mean_abs": statistics.fmean(diffs), "max_abs": max(diffs)}
    config = TrainConfig(learning_rate=1e-5, micro_batch_tokens=args.micro_batch_tokens)
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        trainer.rl_step(seqs, config)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return {
        "variant": variant,
        "median_s": statistics.median(times),
        "best_s": min(times),
        "times": times,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "logprob_mismatch_vs_fp32": mismatch,
    }


def main() -> None:
    from art_langgraph.training import TrainConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--completion-tokens", type=int, default=100)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=TrainConfig().micro_batch_tokens)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--only", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.only:
        print(json.dumps(child(args.only, args)))
        return
    import torch

    rows = []
    for v in VARIANTS:
        cmd = [sys.executable, "-m", "bench.probes.trainer_step", "--only", v]
        for k in (
            "sequences",
            "prompt_tokens",
            "completion_tokens",
            "steps",
            "warmup",
            "micro_batch_tokens",
        ):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["median_s"]
    lines = [
        f"machine: {torch.get_num_threads()} torch threads, cpu, torch {torch.__version__}; "
        f"SmolLM2-135M-Instruct, LoRA r=8 on all projections; {args.sequences} sequences x "
        f"{args.prompt_tokens + args.completion_tokens} tokens ({args.completion_tokens} trained "
        f"each), micro-batches of {args.micro_batch_tokens} tokens; {args.warmup} warm-up + {args.steps} timed steps per variant",
        "",
        "| variant | median s | best s | × full_logits_fp32 | peak RSS MiB | logprob mismatch vs fp32 (mean / max abs) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        mm = r["logprob_mismatch_vs_fp32"]
        mms = f"{mm['mean_abs']:.4f} / {mm['max_abs']:.3f}" if mm else "-"
        lines.append(
            f"| {r['variant']} | {r['median_s']:.2f} | {r['best_s']:.2f} | "
            f"{r['median_s'] / base:.2f} | {r['peak_rss_mib']:.0f} | {mms} |"
        )
    table = "\n".join(lines)
    print(table)
    from bench.readme import update_docs, write_results

    write_results(
        args.out,
        {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "markdown": table},
    )
    if args.out == RESULTS:
        update_docs("trainer_step", table)


if __name__ == "__main__":
    main()
