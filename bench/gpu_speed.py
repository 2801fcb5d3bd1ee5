"""LoRA training and serving on one CUDA GPU, on random-weight models of real shapes, in bf16.

The GPU machines this project is lent have no model hub, so the models are Qwen2.5's
shapes (`qwen2-0.5b`, `qwen2-1.5b`, `qwen2-7b`: layers, widths, heads, vocabulary) with
random weights and the tiny preset's tokenizer (prompts draw ids below its vocabulary; the
model keeps its real vocabulary, so the head costs what it costs). Speed does not depend
on the weights. Runs before 2026-12-04's review warmed serve/ours up on prompts that were
nearly the measured ones (a vocabulary one id smaller, the same random draws), so its
measured batches were served from its prefix cache while `generate` prefilled; at 128
tokens a prompt that prefill is under 1% of a batch's time on the H200.

Arms, each in a child process of its own (its own peak GPU memory), per shape:

- `train/ours`: `LoRATrainer.rl_step` with its defaults on bench.trainer_roofline's
  `agent` batch (8 groups x 4 rollouts sharing a 500-token prompt, 3 turns of 25 trained
  and 40 tool tokens); it then saves its adapter for `serve/ours`;
- `train/plain`: bench.trainer_roofline's plain peft loop (TRL-style padded rows) on the
  same batch, bf16 weights;
- `serve/ours`: `TorchEngine` generating 128 tokens (sampled, EOS ignored) after a distinct
  128-token prompt for each of 1, 32, 128 concurrent requests; then the adapter swap:
  `load_adapter` of the trainer's adapter, and the first token generated under it;
- `serve/hf`: transformers' `generate` on the same prompts as one padded batch.
- `matmul`: an 8192^3 bf16 matmul, the GPU's reachable rate: "MFU" below is tokens/s x
  4 x base parameters (forward, and backward to the activations) over that rate.

    python -m bench.gpu_speed [--shapes qwen2-0.5b,qwen2-7b] [--out FILE] [--profile-serve 128]

`--profile-serve N` adds to serve/ours a torch.profiler run of N requests' decode (32
tokens each): the ops by GPU time and by CPU time, saved in the results file.

`--device cpu --shapes tiny-shape` runs every arm on a toy shape on the CPU: a check of
the script, not a measurement.

Left out: vLLM (not installed on the GPU machines), several GPUs, FSDP, the rollouts of a
real agent (bench.agent_rollouts).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("gpu_speed") / "gpu_speed.json"
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": dict(  # Qwen2.5-0.5B's config.json
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2-1.5b": dict(  # Qwen2.5-1.5B's config.json
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2-7b": dict(  # Qwen2.5-7B's config.json
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "tiny-shape": dict(  # a check of the script on the CPU
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=40960,  # above the training batch's token ids
        tie_word_embeddings=True,
    ),
}
"""Shape name -> Qwen2Config fields (with rope theta 1e6 and a 32k context, as released)."""
ARMS = ("matmul", "train/ours", "train/plain", "serve/ours", "serve/hf")
BATCHES = (1, 32, 128)
PROMPT, NEW = 128, 128


def build(shape: str, folder: Path, device: str) -> None:
    """A random-weight model of `shape` in bf16, saved with the tiny preset's tokenizer."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from art_langgraph.presets import build_tiny

    tiny = build_tiny()
    tok = AutoTokenizer.from_pretrained(tiny)
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        **SHAPES[shape],
        max_position_embeddings=32768,
        rope_theta=1e6,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_gib(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _roofline_args(args: argparse.Namespace, folder: Path) -> argparse.Namespace:
    """bench.trainer_roofline's arguments for its `agent` batch and plain loop."""
    return argparse.Namespace(
        base_model=str(folder),
        groups=8,
        group_size=4,
        head=500,
        system=450,
        turns=3,
        plain_rows=args.plain_rows,
        warmup=args.warmup,
        steps=args.steps,
        device=args.device,
        weights_dtype="bfloat16",
    )


def _timed(step: Any, args: argparse.Namespace) -> list[float]:
    times = []
    for k in range(args.warmup + args.steps):
        _sync(args.device)
        t0 = time.perf_counter()
        step()
        _sync(args.device)
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
    return times


def arm_matmul(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    import torch

    n = 8192 if args.device.startswith("cuda") else 1024
    a = torch.randn(n, n, device=args.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=args.device, dtype=torch.bfloat16)
    times = _timed(lambda: [a @ b for _ in range(10)], args)
    return {"tflops": 2 * n**3 * 10 / statistics.median(times) / 1e12}


def arm_train_ours(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from art_langgraph.training.config import ModelConfig, TrainConfig
    from art_langgraph.training.trainer import LoRATrainer
    from bench.trainer_roofline import batch

    seqs = batch("agent", _roofline_args(args, folder))
    trainer = LoRATrainer(str(folder), ModelConfig(), device=args.device)
    config = TrainConfig(learning_rate=1e-5)
    metrics: dict[str, float] = {}

    def step() -> None:
        nonlocal metrics
        metrics = trainer.rl_step(seqs, config)

    times = _timed(step, args)
    (folder / "adapter").mkdir()
    trainer.save(folder / "adapter")
    return {
        "times": times,
        "tokens": sum(len(s) for s in seqs),
        "loss": metrics["loss"],
        "dtype": str(trainer.dtype),
        "compute_dtype": str(trainer.compute_dtype),
        "gradient_checkpointing": str(trainer.config.gradient_checkpointing),
    }


def arm_train_plain(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from bench.trainer_roofline import batch, run_plain

    ns = _roofline_args(args, folder)
    seqs = batch("agent", ns)
    out = run_plain(seqs, "bfloat16", ns)
    out["tokens"] = sum(len(s) for s in seqs)
    return out


def _prompts(n: int, vocab: int, salt: int = 0) -> list[list[int]]:
    """`n` prompts of PROMPT token ids below `vocab`; another `salt`, other prompts (a
    warm-up's must not be the measured ones, or the engine's prefix cache serves them)."""
    rng = random.Random(f"{n}/{salt}")
    return [[rng.randrange(100, vocab) for _ in range(PROMPT)] for _ in range(n)]


def arm_serve_ours(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from art_langgraph.engine import SamplingParams, TorchEngine, TorchEngineConfig

    engine = TorchEngine.from_pretrained(str(folder), TorchEngineConfig(device=args.device))
    vocab = len(engine.tokenizer)
    out: dict[str, Any] = {"dtype": str(next(engine.model.parameters()).dtype)}

    async def run() -> None:
        for b in BATCHES:
            prompts = _prompts(b, vocab)
            params = [
                SamplingParams(max_tokens=NEW, temperature=1.0, ignore_eos=True, seed=i)
                for i in range(b)
            ]
            warm = SamplingParams(max_tokens=4, ignore_eos=True)
            await asyncio.gather(*(engine.generate(p, warm) for p in _prompts(b, vocab, salt=1)))
            t0 = time.perf_counter()
            results = await asyncio.gather(
                *(engine.generate(p, s) for p, s in zip(prompts, params, strict=True))
            )
            seconds = time.perf_counter() - t0
            new = sum(len(r.completion_token_ids) for r in results)
            out[f"batch{b}"] = {"seconds": seconds, "new_tokens": new, "tok_s": new / seconds}
        t0 = time.perf_counter()
        await engine.load_adapter("trained", str(folder / "adapter"))
        loaded = time.perf_counter() - t0
        first = await engine.generate(
            _prompts(1, vocab, salt=2)[0], SamplingParams(max_tokens=1), adapter="trained"
        )
        out["swap"] = {
            "load_s": loaded,
            "load_and_first_token_s": time.perf_counter() - t0,
            "tokens": len(first.completion_token_ids),
        }
        if args.profile_serve:
            out["profile"] = await _profile_decode(engine, args.profile_serve, vocab)

    try:
        asyncio.run(run())
    finally:
        engine.close_sync()
    return out


async def _profile_decode(engine: Any, rows: int, vocab: int) -> dict[str, Any]:
    """torch.profiler over `rows` requests of 32 sampled tokens: the ops that took the time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from art_langgraph.engine import SamplingParams

    prompts = _prompts(rows, vocab, salt=3)
    params = SamplingParams(max_tokens=32, temperature=1.0, ignore_eos=True)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    # the engine's worker thread runs the model: profile every thread, not only this one
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    t0 = time.perf_counter()
    with profile(activities=activities, experimental_config=config) as prof:
        await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    seconds = time.perf_counter() - t0
    averages = prof.key_averages()
    by_device = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return {
        "rows": rows,
        "new_tokens": 32,
        "seconds": seconds,
        "by_device_time": averages.table(sort_by=by_device, row_limit=25).splitlines(),
        "by_cpu_time": averages.table(sort_by="self_cpu_time_total", row_limit=25).splitlines(),
    }


def arm_serve_hf(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(args.device)
    model.eval()
    out: dict[str, Any] = {}
    for b in BATCHES:
        ids = torch.tensor(_prompts(b, len(tok)), device=args.device)
        kw = dict(
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            min_new_tokens=NEW,
            max_new_tokens=NEW,
            pad_token_id=tok.pad_token_id,
        )
        with torch.inference_mode():
            model.generate(ids[:, :8], **{**kw, "min_new_tokens": 4, "max_new_tokens": 4})
            _sync(args.device)
            t0 = time.perf_counter()
            gen = model.generate(ids, **kw)
            _sync(args.device)
        seconds = time.perf_counter() - t0
        new = int(gen.shape[0] * (gen.shape[1] - PROMPT))
        out[f"batch{b}"] = {"seconds": seconds, "new_tokens": new, "tok_s": new / seconds}
    return out


ARM_FUNCS = {
    "matmul": arm_matmul,
    "train/ours": arm_train_ours,
    "train/plain": arm_train_plain,
    "serve/ours": arm_serve_ours,
    "serve/hf": arm_serve_hf,
}


def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    folder = Path(args.folder)
    t0 = time.perf_counter()
    out = ARM_FUNCS[args.arm](args, folder)
    out["wall_s"] = time.perf_counter() - t0
    out["peak_gib"] = _peak_gib(args.device)
    if "times" in out:
        out["step_s"] = statistics.median(out["times"])
        out["tokens_per_s"] = out["tokens"] / out["step_s"]
    if args.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name()
    return out


def base_params(folder: Path) -> int:
    """Parameters a token's matmuls touch: all but the input embedding, plus the head."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(folder)
    h, i, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    kv = h // c.num_attention_heads * c.num_key_value_heads
    layer = h * h * 2 + h * kv * 2 + 3 * h * i
    return n * layer + c.vocab_size * h


def table(data: dict[str, Any]) -> str:
    lines = [
        f"{data['gpu']}; bf16 weights and matmuls; random weights of the named shape; "
        f"train: {data['train_batch']}; serve: {PROMPT}-token prompts, {NEW} new tokens "
        f"sampled; MFU against a measured 8192^3 bf16 matmul "
        f"({data.get('matmul_tflops', float('nan')):.0f} TFLOP/s)",
        "",
        "| shape | train ours tok/s | plain peft tok/s | ours / plain | ours MFU | peak GiB "
        "ours / plain | decode tok/s b=1 ours / HF | b=32 | b=128 | swap: load, +first token |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape, r in data["shapes"].items():
        ours, plain = r.get("train/ours", {}), r.get("train/plain", {})
        so, sh = r.get("serve/ours", {}), r.get("serve/hf", {})
        o, p = ours.get("tokens_per_s", float("nan")), plain.get("tokens_per_s", float("nan"))
        mfu = o * 4 * r["base_params"] / (data.get("matmul_tflops", float("nan")) * 1e12)
        cells = []
        for b in BATCHES:
            a = so.get(f"batch{b}", {}).get("tok_s", float("nan"))
            h = sh.get(f"batch{b}", {}).get("tok_s", float("nan"))
            cells.append(f"{a:,.0f} / {h:,.0f}")
        swap = so.get("swap", {})
        lines.append(
            f"| {shape} | {o:,.0f} | {p:,.0f} | {o / p:.2f}x | {mfu:.0%} | "
            f"{ours.get('peak_gib', float('nan')):.1f} / {plain.get('peak_gib', float('nan')):.1f} "
            f"| {' | '.join(cells)} | {swap.get('load_s', float('nan')) * 1e3:.0f} ms, "
            f"{swap.get('load_and_first_token_s', float('nan')) * 1e3:.0f} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="qwen2-0.5b,qwen2-7b")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--device", default="cuda")
    p.add_argument("--plain-rows", type=int, default=4, help="rows per pass of the plain loop")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--workdir", default="/tmp/gpu_speed")
    p.add_argument(
        "--profile-serve",
        type=int,
        default=0,
        help="after serve/ours's batches, profile this many requests' decode (0: none)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--arm", help=argparse.SUPPRESS)  # internal: one arm, printed as JSON
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args)), flush=True)
        return
    data: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "device": args.device,
        "train_batch": "8 groups x 4 rollouts, 500-token prompts (450 common), 3 turns of "
        "25 trained + 40 tool tokens",
        "shapes": {},
    }
    for shape in args.shapes.split(","):
        folder = Path(args.workdir) / shape
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        t0 = time.perf_counter()
        build(shape, folder, args.device)
        print(f"{shape}: built in {time.perf_counter() - t0:.0f} s", flush=True)
        r: dict[str, Any] = {"base_params": base_params(folder)}
        for arm in args.arms.split(","):
            if arm == "matmul" and "matmul_tflops" in data:
                continue
            argv = [*sys.argv[1:], "--arm", arm, "--folder", str(folder)]
            proc = subprocess.run(
                [sys.executable, "-m", "bench.gpu_speed", *argv], capture_output=True, text=True
            )
            if proc.returncode != 0:
                print(f"{shape} {arm}: failed\n{proc.stderr[-3000:]}", flush=True)
                r[arm] = {"error": proc.stderr[-3000:]}
                continue
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            if arm == "matmul":
                data["matmul_tflops"] = res["tflops"]
            else:
                r[arm] = res
            data["gpu"] = res.get("gpu", args.device)
            print(f"{shape} {arm}: {json.dumps(res)[:600]}", flush=True)
        data["shapes"][shape] = r
        shutil.rmtree(folder, ignore_errors=True)
        write_results(args.out, data)  # each shape kept as it ends
    text = table(data)
    data["table"] = text.splitlines()
    write_results(args.out, data)
    print(text)
    if args.out == RESULTS and args.device.startswith("cuda"):
        update_docs("gpu_speed", text)


if __name__ == "__main__":
    main()
