"""Our GRPO trainer against a plain transformers + peft loop and the machine's matmul limit.

Each arm runs in a child process of its own (its own peak RSS, no shared allocator), on
the *same* sequences, in the same dtype:

- `ours`: `LoRATrainer.rl_step` with its defaults (packed rows, prefix tree, segmented
  attention, logits only at trained tokens);
- `plain`: what a TRL-style loop does: the peft model (the same LoRA: rank, alpha, all
  linear layers), one sequence per row, right-padded, a few rows a pass; logits for each
  row's tail from its first trained token on (TRL's `logits_to_keep`), log-softmax and
  gather, a clipped-ratio loss on the trained tokens, backward, one AdamW step;
- `matmul`: a (tokens x hidden) @ (hidden x intermediate) matmul of the model's own shapes,
  in the same dtype: the machine's GFLOP/s, and from it the tokens/s a forward+backward of
  the frozen base would reach if it ran at that rate (4 x base params FLOPs a token: the
  forward, and the backward to the activations; the LoRA weights' own gradients are small).

tokens/s is the batch's tokens (the sum of the sequences' lengths, the same for every arm)
over the median step time. Two batches:

- `agent`: `--groups` x `--group-size` sequences, each group sharing a ~`--head`-token
  prompt whose first `--system` tokens are common to all groups (system prompt and tool
  specs), then `--turns` turns of a 25-token completion (trained) and a 40-token tool result;
- `short`: as many sequences with a 64-token prompt each of its own and one 128-token
  completion.

The dtype is the trainer's `auto` for this host: bfloat16 autocast where the CPU multiplies
bf16 in hardware (AMX / AVX-512-BF16), float32 elsewhere (`--compute-dtype` overrides it).

    .venv/bin/python -m bench.trainer_roofline [--batches agent,short] [--steps 2]

Left out: packing in the plain loop (transformers' SDPA path has no variable-length
kernel on the CPU), the rollouts (bench.agent_rollouts), GPUs (bench.gpu_speed).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from art_langgraph.runtime.allocator import allocator_in_use, reexec_with_tcmalloc
from bench.readme import publish, results_dir

RESULTS = results_dir("trainer_roofline") / "trainer_roofline.json"
ARMS = ("ours", "plain", "matmul")
BATCHES = ("agent", "short")


def cpu_flags() -> str:
    """The CPU's matmul-relevant flags, for every table (`devices.matmul_flags`)."""
    from art_langgraph.runtime.devices import matmul_flags

    return matmul_flags()


def batch(name: str, args: argparse.Namespace) -> list[Any]:
    """The sequences of batch `name` (random token ids, advantages +-1)."""
    from art_langgraph.training.tensorize import TrainSequence

    rng = random.Random(0)
    n = args.groups * args.group_size
    seqs = []
    if name == "short":
        for _ in range(n):
            ids = [rng.randrange(1000, 40000) for _ in range(64 + 128)]
            mask = [False] * 64 + [True] * 128
            lps = [-1.0 if m else float("nan") for m in mask]
            seqs.append(TrainSequence(ids, mask, lps, rng.choice([-1.0, 1.0])))
        return seqs
    common = [rng.randrange(1000, 40000) for _ in range(args.system)]
    for _ in range(args.groups):
        head = common + [rng.randrange(1000, 40000) for _ in range(args.head - args.system)]
        for _ in range(args.group_size):
            ids, mask = list(head), [False] * len(head)
            for _ in range(args.turns):
                ids += [rng.randrange(1000, 40000) for _ in range(25)]
                mask += [True] * 25
                ids += [rng.randrange(1000, 40000) for _ in range(40)]
                mask += [False] * 40
            lps = [-1.0 if m else float("nan") for m in mask]
            seqs.append(TrainSequence(ids, mask, lps, rng.choice([-1.0, 1.0])))
    return seqs


def compute_dtype(choice: str) -> str:
    from art_langgraph.runtime.devices import cpu_has_fast_bf16

    if choice != "auto":
        return choice
    return "bfloat16" if cpu_has_fast_bf16() else "float32"


def _timed(step: Any, args: argparse.Namespace) -> list[float]:
    times = []
    for k in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        step()
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
    return times


def run_ours(seqs: list[Any], dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    from art_langgraph.presets.resolve import resolve_preset
    from art_langgraph.training.config import ModelConfig, TrainConfig
    from art_langgraph.training.trainer import LoRATrainer

    trainer = LoRATrainer(resolve_preset(args.base_model), ModelConfig(compute_dtype=dtype))
    config = TrainConfig(learning_rate=1e-5)
    metrics: dict[str, float] = {}

    def step() -> None:
        nonlocal metrics
        metrics = trainer.rl_step(seqs, config)

    times = _timed(step, args)
    return {
        "times": times,
        "loss": metrics["loss"],
        "processed_tokens": sum(len(s) for s in seqs) - metrics["shared_prefix_tokens"],
    }


def run_plain(seqs: list[Any], dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """A TRL-style loop over the peft model: padded rows, logits for each row's tail.

    On the CPU: float32 weights, `dtype` the matmuls' (autocast for bfloat16). `args.device`
    (default "cpu") and `args.weights_dtype` (default "float32") move it elsewhere:
    bench.gpu_speed runs it on CUDA over bfloat16 weights, as our trainer's `auto` does."""
    import contextlib

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from art_langgraph.presets.resolve import resolve_preset
    from art_langgraph.training.config import ModelConfig

    device = torch.device(getattr(args, "device", None) or "cpu")
    weights = getattr(torch, getattr(args, "weights_dtype", None) or "float32")
    mc = ModelConfig()
    base = AutoModelForCausalLM.from_pretrained(
        resolve_preset(args.base_model), dtype=weights, attn_implementation="sdpa"
    ).to(device)
    lora = LoraConfig(
        r=mc.lora_r,
        lora_alpha=mc.lora_alpha,
        target_modules=list(mc.target_modules),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    autocast: Any = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if dtype == "bfloat16" and weights != torch.bfloat16
        else contextlib.nullcontext()
    )
    rows = max(1, args.plain_rows)
    n_trained = sum(sum(s.trainable) for s in seqs)
    head = base.get_output_embeddings()

    def step() -> None:
        model.train()
        opt.zero_grad(set_to_none=True)
        for i in range(0, len(seqs), rows):
            part = seqs[i : i + rows]
            width = max(len(s) for s in part)
            ids = torch.zeros((len(part), width), dtype=torch.long)
            att = torch.zeros((len(part), width), dtype=torch.long)
            train = torch.zeros((len(part), width), dtype=torch.bool)
            adv = torch.zeros((len(part), 1))
            for r, s in enumerate(part):
                ids[r, : len(s)] = torch.tensor(s.tokens)
                att[r, : len(s)] = 1
                train[r, : len(s)] = torch.tensor(s.trainable)
                adv[r, 0] = s.advantage
            ids, att, train, adv = (t.to(device) for t in (ids, att, train, adv))
            first = int(train.float().argmax(dim=1).min())  # earliest trained position
            keep = width - first + 1  # logits for positions first-1 .. width-1
            with autocast:
                hidden = model.base_model.model.model(input_ids=ids, attention_mask=att)[0]
            logits = head(hidden[:, -keep:-1].to(head.weight.dtype)).float()  # (R, K-1, V)
            lp = logits.log_softmax(-1).gather(-1, ids[:, -keep + 1 :, None]).squeeze(-1)
            m = train[:, -keep + 1 :]
            ratio = torch.exp(lp - lp.detach())
            per = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            loss = (per * m).sum() / n_trained
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return {"times": _timed(step, args), "processed_tokens": sum(len(s) for s in seqs)}


def run_matmul(seqs: list[Any], dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig

    from art_langgraph.presets.resolve import resolve_preset

    cfg = AutoConfig.from_pretrained(resolve_preset(args.base_model))
    dt_ = getattr(torch, dtype)
    a = torch.randn(2048, cfg.hidden_size).to(dt_)
    b = torch.randn(cfg.hidden_size, cfg.intermediate_size).to(dt_)
    for _ in range(3):
        a @ b
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    seconds = (time.perf_counter() - t0) / reps
    gflops = 2 * 2048 * cfg.hidden_size * cfg.intermediate_size / seconds / 1e9
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(cfg)
    params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    params += cfg.vocab_size * cfg.hidden_size  # the head (tied to the embedding)
    return {"gflops": gflops, "base_params": params}


def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    dtype = compute_dtype(args.compute_dtype)
    seqs = batch(args.batch, args)
    fn = {"ours": run_ours, "plain": run_plain, "matmul": run_matmul}[args.arm]
    out = fn(seqs, dtype, args)
    out.update(
        dtype=dtype,
        tokens=sum(len(s) for s in seqs),
        trained_tokens=sum(sum(s.trainable) for s in seqs),
        threads=torch.get_num_threads(),
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    if "times" in out:
        out["step_s"] = statistics.median(out["times"])
        out["tokens_per_s"] = out["tokens"] / out["step_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--compute-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--batches", default=",".join(BATCHES))
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--head", type=int, default=500)
    p.add_argument("--system", type=int, default=450, help="head tokens common to all groups")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--plain-rows", type=int, default=4, help="rows per pass of the plain loop")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--arm", help=argparse.SUPPRESS)  # internal: one arm, printed as JSON
    p.add_argument("--batch", help=argparse.SUPPRESS)
    args = p.parse_args()
    reexec_with_tcmalloc()  # as art-mcp runs (art_langgraph/runtime/allocator.py); every arm alike
    if args.arm:
        print(json.dumps(run_arm(args)), flush=True)
        return

    results: dict[str, dict[str, Any]] = {}
    for b in args.batches.split(","):
        for arm in args.arms.split(","):
            argv = [*sys.argv[1:], "--arm", arm, "--batch", b]
            out = subprocess.run(
                [sys.executable, "-m", "bench.trainer_roofline", *argv],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[f"{b}/{arm}"] = json.loads(out.strip().splitlines()[-1])
            print(f"{b}/{arm}: {results[f'{b}/{arm}']}", flush=True)
    dtype = next(iter(results.values()))["dtype"]
    lines = [
        f"{args.base_model}, {dtype}, 2 cores ({platform.machine()}, CPU flags: {cpu_flags()}), "
        f"malloc: {allocator_in_use()}; "
        f"agent: {args.groups} groups x {args.group_size}, {args.head}-token prompts "
        f"({args.system} common to all), {args.turns} turns of 25 trained + 40 tool tokens; "
        f"short: as many 64-token prompts + 128 trained tokens",
        "",
        "| batch | tokens | ours tok/s | plain peft tok/s | ours / plain | matmul-limit tok/s "
        "| ours / limit | peak RSS ours / plain (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in args.batches.split(","):
        ours, plain = results.get(f"{b}/ours"), results.get(f"{b}/plain")
        mm = results.get(f"{b}/matmul")
        limit = mm["gflops"] * 1e9 / (4 * mm["base_params"]) if mm else float("nan")
        o = ours["tokens_per_s"] if ours else float("nan")
        pl = plain["tokens_per_s"] if plain else float("nan")
        tokens = (ours or plain or {}).get("tokens", 0)
        lines.append(
            f"| {b} | {tokens:,} | {o:.0f} | {pl:.0f} | {o / pl:.2f}x | {limit:.0f} | "
            f"{o / limit:.2f}x | {(ours or {}).get('peak_rss_mib', 0):.0f} / "
            f"{(plain or {}).get('peak_rss_mib', 0):.0f} |"
        )
    if any(k.endswith("/matmul") for k in results):
        mm = next(v for k, v in results.items() if k.endswith("/matmul"))
        lines.append("")
        lines.append(f"matmul 2048 x hidden x intermediate: {mm['gflops']:.0f} GFLOP/s ({dtype})")
    publish("trainer_roofline", RESULTS, lines, args, results=results)


if __name__ == "__main__":
    main()
