"""One RL step on the tiny preset: `LocalBackend` + `TrainableModel` against TRL's `GRPOTrainer`.

What it measures, on the tiny preset (CPU, float32, LoRA r=8 alpha=16 on all
attention and MLP projections, the same prompts and reward for both sides):

1. `rl_step`: seconds per full GRPO step. Ours: P prompts × G concurrent chat requests
   through the OpenAI-compatible server (C completion tokens each, `ignore_eos`), the
   trajectories recorded with `LLMCall.from_openai`, then `model.train` (checks,
   advantages, trajectories JSONL, token-exact tensorization, one optimizer step,
   checkpoint on disk, adapter swapped into the engine); the wall time of all of it.
   TRL: `GRPOTrainer` (transformers `generate`, `use_vllm=False`) with `num_generations=G`,
   `max_completion_length=C`, `min_new_tokens=C` (so lengths match), one optimizer step
   per P × G completions (`per_device_train_batch_size=P*G`, no accumulation), `beta=0`,
   no gradient checkpointing, plain temperature-1 sampling (`top_k=0`, `top_p=1`, no
   `min_p`), no logging or saving; seconds from its `on_step_begin` to its `on_step_end`
   callback (generation happens in between), and of its `generate` call alone.
   TRL runs in a child process (`--only trl --lockstep`) so each side's peak RSS is its
   own; it waits for the parent's go before each step, so the two alternate (one TRL
   step, then one of ours per variant) and the noise of a shared machine falls on both,
   while neither runs when the other is timed. Both run `--warmup` untimed steps, then
   `--steps` timed ones; the table reports medians, the ratio ours / TRL of the medians
   (target ≤ 1) and of the fastest steps (the least disturbed), with each side's
   generation share. Ours alternates the default `TrainConfig()` (sequences packed)
   with `pack_sequences=False` (a diagnostic row) on the same model.
2. `packing`: trainer tokens/s (`metrics['train_tokens_per_s']`, real tokens over the
   step's seconds) of one `LoRATrainer.rl_step` on the same `--pack-seqs` constructed
   sequences (lengths drawn uniformly in 20..400, a third of each a masked prompt) with
   `TrainConfig(pack_sequences=True)` and `pack_sequences=False` (one padded row per
   sequence), alternated, median of `--pack-repeats`; with the micro-batch shapes the
   trainer really built (recorded by wrapping its `micro_batches`, whatever rule picks
   the row length) and `metrics['padding_waste']`.
3. `swap`: from `model.train()` returning to the first request for `m` (max_tokens=1)
   completing, whose `model` must be `m@{new step}`; over every step of part 1 plus
   `--swap-steps` more (each trains one group again). A second identical request right
   after gives the steady-state latency of such a request. Also `metrics['swap_seconds']`
   (the adapter load inside `train`).
4. Peak RSS (`ru_maxrss`) of our process after `register`, after part 1 and at the end
   (parts 2 and 3 add a second trainer); of TRL's child after its imports and at the end.

Left out: GPUs, vLLM, KL to a reference model (`beta=0` on both sides), multi-turn and
tool rollouts, several optimizer steps per batch, TRL's own reward-model and logging
paths, and learning quality (the tiny model is random). Ours includes what TRL does not
do (an HTTP round trip per completion, trajectory records, a checkpoint on disk each
step); TRL includes what ours skips (nothing here: zero-variance groups are counted
below, and there are none with this reward). The machine is shared: read the ratios.

Run (from the repository root):

    .venv/bin/python -m bench.rl_step [--prompts 4 --group-size 8 --completion-tokens 32 --steps 3]

`--only ours` runs part 1 for our side alone and prints its steps (nothing saved), e.g.
under `.venv/bin/py-spy record -o out.txt -f raw -- .venv/bin/python -m bench.rl_step
--only ours`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.readme import update_readme, write_results

RESULTS = Path(__file__).resolve().parent / "results" / "rl_step.json"

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
    "boxing matches near the river bank and every sailor counts stars before dawn"
).split()

TARGETS = {"ours_over_trl": 1.0, "swap_median_ms": 50.0}
"""ours / TRL seconds per step at most 1.0; median swap latency at most 50 ms."""

LR = 1e-5

PROTOCOL = "@@rl_step"
"""Prefix of the lines the TRL child and the parent exchange on its stdin/stdout."""

STEP_METRICS = (
    "train_seconds",
    "swap_seconds",
    "step_seconds",
    "train_tokens_per_s",
    "padding_waste",
    "zero_variance_groups",
    "sequences",
    "reward",
)
"""Metrics of `model.train` kept per step."""


def make_prompts(n: int) -> list[str]:
    """Distinct prompts whose lengths vary with i (6 to 30 words)."""
    return [
        f"Task {i}: write numbers about "
        + " ".join(WORDS[(5 * i + j) % len(WORDS)] for j in range(6 + (11 * i) % 25))
        for i in range(n)
    ]


def reward(text: str | None) -> float:
    """The fraction of characters that are digits (the same function on both sides)."""
    text = text or ""
    return sum(ch.isdigit() for ch in text) / len(text) if text else 0.0


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class BatchShapes:
    """Records the (rows, row tokens) of every micro-batch the trainer builds.

    Wraps `micro_batches` as the trainer module imported it (restored on exit), so the
    shapes are the ones the trainer really used, whatever rule picks its row length.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def __enter__(self) -> BatchShapes:
        from art_langgraph.training import trainer

        self._module, self._orig = trainer, trainer.micro_batches

        def recording(*a: Any, **k: Any) -> Any:
            for mb in self._orig(*a, **k):
                self.seen.append((int(mb.input_ids.shape[0]), int(mb.input_ids.shape[1])))
                yield mb

        trainer.micro_batches = recording  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        self._module.micro_batches = self._orig  # type: ignore[assignment]

    def take(self) -> list[tuple[int, int]]:
        out, self.seen = self.seen, []
        return out


def describe(shapes: list[tuple[int, int]]) -> dict[str, int]:
    return {
        "micro_batches": len(shapes),
        "rows": sum(r for r, _ in shapes),
        "max_row_tokens": max((n for _, n in shapes), default=0),
        "cells": sum(r * n for r, n in shapes),
    }


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


# --------------------------------------------------------------------------- TRL
def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    """TRL's GRPOTrainer for warmup + steps optimizer steps; runs in the child process."""
    import transformers
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback

    import art_langgraph as art
    from art_langgraph.presets import build_tiny

    rss_imports = peak_rss_mib()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    path = str(build_tiny())
    p, g, c = args.prompts, args.group_size, args.completion_tokens
    data = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": q}] for q in make_prompts(p)]}
    )
    mc = art.ModelConfig(lora_r=8, lora_alpha=16)
    lora = LoraConfig(
        r=mc.lora_r,
        lora_alpha=mc.lora_alpha,
        lora_dropout=mc.lora_dropout,
        target_modules=list(mc.target_modules),
        task_type="CAUSAL_LM",
    )

    def trl_reward(completions: list[Any], **_: Any) -> list[float | None]:
        return [reward(x[-1]["content"] if isinstance(x, list) else x) for x in completions]

    begins: list[float] = []
    steps: list[float] = []
    gen_s: list[float] = []
    completion_lens: list[int] = []
    widths: list[int] = []  # prompt + completion tokens of the (padded) rows

    class StepTimes(TrainerCallback):
        """Times each optimizer step; with --lockstep, waits for the parent's go first."""

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            if args.lockstep:
                print(f"{PROTOCOL} ready", flush=True)
                if not sys.stdin.readline():
                    raise SystemExit("parent went away")
            begins.append(time.perf_counter())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            steps.append(time.perf_counter() - begins[-1])
            if args.lockstep:
                print(f"{PROTOCOL} done {steps[-1]:.6f}", flush=True)

    with tempfile.TemporaryDirectory(prefix="rl_step_trl.") as out:
        cfg = trl.GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=p * g,
            gradient_accumulation_steps=1,
            num_generations=g,
            max_completion_length=c,
            max_steps=args.warmup + args.steps,
            learning_rate=LR,
            beta=0.0,
            num_iterations=1,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            min_p=None,
            generation_kwargs={"min_new_tokens": c},
            mask_truncated_completions=False,
            activation_checkpointing=False,  # GRPOConfig's default is on; ours is off
            bf16=False,
            fp16=False,
            use_cpu=True,
            use_vllm=False,
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            disable_tqdm=True,
            log_completions=False,
            dataloader_num_workers=0,
            seed=args.seed,
        )
        trainer = trl.GRPOTrainer(
            model=path,
            reward_funcs=trl_reward,
            args=cfg,
            train_dataset=data,
            peft_config=lora,
            callbacks=[StepTimes()],
        )
        if trainer.args.gradient_checkpointing:
            raise RuntimeError("TRL would checkpoint activations; ours does not")
        inner = trainer._generate_single_turn

        def timed_generate(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            out_ = inner(*a, **k)
            gen_s.append(time.perf_counter() - t)
            completion_lens.extend(len(ids) for ids in out_[0])
            prompts = a[0] if a else k["prompt_ids"]
            widths.append(max(map(len, prompts)) + max(map(len, out_[0])))
            return out_

        trainer._generate_single_turn = timed_generate  # type: ignore[method-assign]
        t0 = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - t0
    if len(steps) != args.warmup + args.steps:
        raise RuntimeError(f"TRL ran {len(steps)} steps, expected {args.warmup + args.steps}")
    if completion_lens and set(completion_lens) != {c}:
        raise RuntimeError(f"TRL completions of {sorted(set(completion_lens))} tokens, not {c}")
    return {
        "step_s": steps,
        "generate_s": gen_s,
        "completions": len(completion_lens),
        "max_row_tokens": max(widths),
        "train_s": total,
        "peak_rss_mib": peak_rss_mib(),
        "rss_after_imports_mib": rss_imports,
        "trl": trl.__version__,
        "torch_threads": torch.get_num_threads(),
    }


class TrlChild:
    """TRL in a child process (`--only trl --lockstep`), one optimizer step per `step()`.

    The child stops before each step until it is told to go, so its steps and ours
    alternate (the noise of a shared machine falls on both) and neither runs while the
    other is timed; its peak RSS stays its own.
    """

    def __init__(self, proc: asyncio.subprocess.Process, json_out: Path, log: Any) -> None:
        self.proc, self.json_out, self.log = proc, json_out, log

    @classmethod
    async def start(cls, args: argparse.Namespace) -> TrlChild:
        fd, tmp = tempfile.mkstemp(prefix="rl_step_trl.", suffix=".json")
        os.close(fd)
        # The child's stderr, shown if it fails; closed by close().
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.rl_step",
            "--only=trl",
            "--lockstep",
            f"--json-out={tmp}",
            f"--prompts={args.prompts}",
            f"--group-size={args.group_size}",
            f"--completion-tokens={args.completion_tokens}",
            f"--steps={args.steps}",
            f"--warmup={args.warmup}",
            f"--seed={args.seed}",
            cwd=Path(__file__).resolve().parent.parent,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        child = cls(proc, Path(tmp), log)
        await child._expect("ready")
        return child

    async def _expect(self, word: str) -> str:
        assert self.proc.stdout is not None
        while line := (await self.proc.stdout.readline()).decode():
            if line.startswith(PROTOCOL):
                got = line[len(PROTOCOL) :].split()
                if got[0] != word:
                    raise RuntimeError(f"TRL child said {got}, expected {word!r}")
                return " ".join(got[1:])
        await self.proc.wait()
        self.log.seek(0)
        raise RuntimeError(
            f"TRL child exited ({self.proc.returncode}) before {word!r}:\n{self.log.read()[-4000:]}"
        )

    async def step(self, last: bool) -> float:
        """Let the child run one step; returns its seconds."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        seconds = float(await self._expect("done"))
        if not last:
            await self._expect("ready")
        return seconds

    async def finish(self) -> dict[str, Any]:
        try:
            assert self.proc.stdout is not None
            await asyncio.wait_for(self.proc.stdout.read(), 120)  # drain what it prints last
            rc = await asyncio.wait_for(self.proc.wait(), 120)
            if rc != 0:
                self.log.seek(0)
                raise RuntimeError(f"TRL child failed ({rc}):\n{self.log.read()[-4000:]}")
            return json.loads(self.json_out.read_text())  # type: ignore[no-any-return]
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        self.json_out.unlink(missing_ok=True)
        self.log.close()


# --------------------------------------------------------------------------- ours
async def run_ours(
    args: argparse.Namespace, tmpdir: str, trl: TrlChild | None = None
) -> dict[str, Any]:
    """Our RL steps (and the swap probes); with `trl`, one TRL step before each round."""
    import art_langgraph as art

    p, g, c = args.prompts, args.group_size, args.completion_tokens
    prompts = make_prompts(p)
    backend = art.LocalBackend(path=tmpdir)
    model = art.TrainableModel(
        name="m",
        project="bench",
        base_model="tiny",
        training=art.ModelConfig(lora_r=8, lora_alpha=16),
    )
    t_reg = time.perf_counter()
    await model.register(backend)
    register_s = time.perf_counter() - t_reg
    rss_register = peak_rss_mib()
    client = model.openai_client(max_retries=0, timeout=300)
    configs = {
        "default": art.TrainConfig(learning_rate=LR),
        "padded": art.TrainConfig(learning_rate=LR, pack_sequences=False),
    }
    cfg = configs["default"]
    out: dict[str, Any] = {
        "register_s": register_s,
        "rss_after_register_mib": rss_register,
        "steps": [],
        "swap": [],
        "prompt_tokens": [],
    }

    async def rollout(prompt: str) -> art.Trajectory:
        kw: dict[str, Any] = dict(
            model=model.inference_name(),
            messages=[{"role": "user", "content": prompt}],
            max_tokens=c,
            temperature=1.0,
            logprobs=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        r = await client.chat.completions.create(**kw)
        call = art.LLMCall.from_openai(kw, r)
        if len(call.completion_token_ids or []) != c:
            raise RuntimeError(f"completion of {len(call.completion_token_ids or [])} tokens")
        return art.Trajectory(
            messages=call.to_messages(), calls=[call], reward=reward(r.choices[0].message.content)
        )

    async def probe(step: int, t_ret: float) -> dict[str, float]:
        lat = []
        for _ in range(2):
            r = await client.chat.completions.create(
                model=model.inference_name(),
                messages=[{"role": "user", "content": prompts[0]}],
                max_tokens=1,
            )
            lat.append(time.perf_counter() - t_ret)
            if r.model != f"m@{step}":
                raise RuntimeError(f"probe after step {step} served by {r.model!r}")
            t_ret = time.perf_counter()
        return {"first_ms": lat[0] * 1e3, "steady_ms": lat[1] * 1e3}

    try:
        groups: list[art.TrajectoryGroup] = []
        rounds = args.warmup + args.steps
        for i in range(rounds):
            if trl is not None:
                sec = await trl.step(last=i == rounds - 1)
                print(f"TRL step {i + 1}: {sec:.2f} s", file=sys.stderr, flush=True)
            for variant, cfg in configs.items():  # alternated, so noise falls on both alike
                t0 = time.perf_counter()
                trajs = await asyncio.gather(*(rollout(q) for q in prompts for _ in range(g)))
                groups = [art.TrajectoryGroup(trajs[k * g : (k + 1) * g]) for k in range(p)]
                t1 = time.perf_counter()
                with BatchShapes() as rec:
                    result = await model.train(groups, cfg)
                t2 = time.perf_counter()
                swap = await probe(result.step, t2)
                m = result.metrics
                out["steps"].append(
                    {
                        "variant": variant,
                        "warmup": i < args.warmup,
                        "wall_s": t2 - t0,
                        "gather_s": t1 - t0,
                        "train_call_s": t2 - t1,
                        **describe(rec.take()),
                        **{k: m.get(k, math.nan) for k in STEP_METRICS},
                    }
                )
                out["swap"].append({"step": result.step, **swap, "swap_seconds": m["swap_seconds"]})
                print(
                    f"ours ({variant}) step {result.step}: {t2 - t0:.2f} s (gather "
                    f"{t1 - t0:.2f}, train {t2 - t1:.2f}), swap probe {swap['first_ms']:.1f} ms",
                    file=sys.stderr,
                    flush=True,
                )
        out["prompt_tokens"] = [
            len(grp.trajectories[0].calls[0].prompt_token_ids or []) for grp in groups
        ]
        out["rss_after_rl_mib"] = peak_rss_mib()
        for _ in range(args.swap_steps):
            result = await model.train(groups[:1], cfg)
            t2 = time.perf_counter()
            swap = await probe(result.step, t2)
            out["swap"].append(
                {"step": result.step, **swap, "swap_seconds": result.metrics["swap_seconds"]}
            )
    finally:
        await client.close()
        await backend.close()
    return out


# ------------------------------------------------------------------------ packing
def make_sequences(n: int, seed: int, vocab: int) -> list[Any]:
    from art_langgraph.training.tensorize import TrainSequence

    rng = random.Random(seed)
    seqs = []
    for i in range(n):
        length = rng.randint(20, 400)
        prompt = length // 3
        tokens = [rng.randrange(vocab) for _ in range(length)]
        trainable = [False] * prompt + [True] * (length - prompt)
        lps = [math.nan] * prompt + [-math.log(vocab) + rng.gauss(0, 0.3) for _ in tokens[prompt:]]
        seqs.append(TrainSequence(tokens, trainable, lps, advantage=1.0 if i % 2 else -1.0))
    return seqs


def run_packing(args: argparse.Namespace) -> dict[str, Any]:
    import art_langgraph as art
    from art_langgraph.presets import build_tiny
    from art_langgraph.training.trainer import LoRATrainer

    trainer = LoRATrainer(str(build_tiny()), art.ModelConfig(lora_r=8, lora_alpha=16), "cpu")
    seqs = make_sequences(args.pack_seqs, args.seed, len(trainer.tokenizer))
    variants = {
        "packed": art.TrainConfig(learning_rate=LR, pack_sequences=True),
        "padded": art.TrainConfig(learning_rate=LR, pack_sequences=False),
    }
    shapes: dict[str, dict[str, int]] = {}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for rep in range(args.pack_repeats + 1):  # the first round warms up
        for name, cfg in variants.items():
            with BatchShapes() as rec:
                m = trainer.rl_step(seqs, cfg)
            shapes[name] = describe(rec.take())
            if rep:
                runs[name].append(
                    {k: m[k] for k in ("train_seconds", "train_tokens_per_s", "padding_waste")}
                )
            print(
                f"packing {name} {rep or 'warm-up'}: {m['train_seconds']:.2f} s, "
                f"{m['train_tokens_per_s']:.0f} tok/s",
                file=sys.stderr,
                flush=True,
            )
    return {
        "sequences": len(seqs),
        "tokens": sum(len(s) for s in seqs),
        "lengths": [len(s) for s in seqs],
        "shapes": shapes,
        "runs": runs,
        "summary": {
            name: {
                "tok_s": median([r["train_tokens_per_s"] for r in rs]),
                "train_s": median([r["train_seconds"] for r in rs]),
                "padding_waste": rs[0]["padding_waste"],
            }
            for name, rs in runs.items()
        },
    }


# ------------------------------------------------------------------------ report
def report(
    args: argparse.Namespace, trl_res: dict[str, Any], ours: dict[str, Any], pk: dict[str, Any]
) -> dict[str, Any]:
    import transformers

    p, g, c = args.prompts, args.group_size, args.completion_tokens
    trl_timed = trl_res["step_s"][args.warmup :]
    trl_s = median(trl_timed)
    trl_gen = median(trl_res["generate_s"][args.warmup :])
    zero_var = sum(s["zero_variance_groups"] for s in ours["steps"])
    labels = {
        "default": "ours, `TrainConfig()` (packed)",
        "padded": "ours, `pack_sequences=False`",
    }
    rl_lines = [
        "| RL step | s/step | generation s | rest s | train s | train tok/s | rows × max row "
        "| padding waste | timed steps (s) | × TRL | × TRL, best |",
        "|---|---:|---:|---:|---:|---:|---|---:|---|---:|---:|",
    ]
    rl: dict[str, dict[str, float]] = {}
    for variant, label in labels.items():
        timed = [s for s in ours["steps"] if s["variant"] == variant and not s["warmup"]]
        v = {
            "s_per_step": median([s["wall_s"] for s in timed]),
            "generation_s": median([s["gather_s"] for s in timed]),
            "train_call_s": median([s["train_call_s"] for s in timed]),
            "train_s": median([s["train_seconds"] for s in timed]),
            "train_tok_s": median([s["train_tokens_per_s"] for s in timed]),
            "padding_waste": median([s["padding_waste"] for s in timed]),
            "swap_s": median([s["swap_seconds"] for s in timed]),
        }
        v["best_s"] = min(s["wall_s"] for s in timed)
        v["over_trl"] = v["s_per_step"] / trl_s
        v["over_trl_best"] = v["best_s"] / min(trl_timed)
        rl[variant] = v
        steps = ", ".join(f"{s['wall_s']:.2f}" for s in timed)
        rl_lines.append(
            f"| {label} | {v['s_per_step']:.3f} | {v['generation_s']:.3f} | "
            f"{v['s_per_step'] - v['generation_s']:.3f} | {v['train_s']:.3f} | "
            f"{v['train_tok_s']:.0f} | {timed[-1]['rows']} × {timed[-1]['max_row_tokens']} | "
            f"{v['padding_waste']:.2f} | {steps} | {v['over_trl']:.2f} "
            f"| {v['over_trl_best']:.2f} |"
        )
    trl_steps = ", ".join(f"{x:.2f}" for x in trl_timed)
    rl_lines.append(
        f"| TRL `GRPOTrainer` | {trl_s:.3f} | {trl_gen:.3f} | {trl_s - trl_gen:.3f} | – | – "
        f"| {p * g} × {trl_res['max_row_tokens']} | – "
        f"| {trl_steps} | 1.00 | 1.00 |"
    )
    rl_table = "\n".join(rl_lines)
    ratio = rl["default"]["over_trl"]
    ours_parts = (
        "× TRL: ratio of the medians; best: of the fastest steps (the least disturbed by "
        "other work on the machine). generation: ours = P × G concurrent requests through "
        "the server, recorded as trajectories; TRL = its `generate` call. rest: ours = the "
        "`model.train` call, of which train s (`metrics['train_seconds']`) is the trainer's "
        "forward, backward and optimizer step and the remainder "
        f"({rl['default']['train_call_s'] - rl['default']['train_s']:.3f} s) checks, "
        "tensorizing, the trajectories file, the checkpoint and the swap; TRL = everything "
        f"else in its step. Zero-variance groups skipped by ours: {zero_var:g}."
    )

    sm = pk["summary"]
    pad_tok_s = sm["padded"]["tok_s"]
    pk_lines = [
        "| trainer (`LoRATrainer.rl_step`) | tokens/s | train s | padding waste "
        "| micro-batches × rows × max row | × padded |",
        "|---|---:|---:|---:|---|---:|",
    ]
    labels = {
        "packed": "`pack_sequences=True`",
        "padded": "`pack_sequences=False`",
    }
    for name, s in sm.items():
        sh = pk["shapes"][name]
        pk_lines.append(
            f"| {labels[name]} | {s['tok_s']:.0f} | {s['train_s']:.3f} | "
            f"{s['padding_waste']:.2f} | "
            f"{sh['micro_batches']} × {sh['rows']} × {sh['max_row_tokens']} | "
            f"{s['tok_s'] / pad_tok_s:.2f} |"
        )
    pk_table = "\n".join(pk_lines)

    swaps = ours["swap"]
    first = [s["first_ms"] for s in swaps]
    steady = [s["steady_ms"] for s in swaps]
    load = [s["swap_seconds"] * 1e3 for s in swaps]

    def at(xs: list[float]) -> str:
        return f"{max(xs):.1f} (step {swaps[xs.index(max(xs))]['step']})"

    swap_table = "\n".join(
        [
            f"| swap ({len(swaps)} steps) | median ms | max ms |",
            "|---|---:|---:|",
            f"| `train()` returns → first request (max_tokens=1) on `m@new` done | "
            f"{median(first):.1f} | {at(first)} |",
            f"| the same request again (steady state) | {median(steady):.1f} | {at(steady)} |",
            f"| `metrics['swap_seconds']` (adapter load inside `train`) | {median(load):.1f} | "
            f"{at(load)} |",
        ]
    )

    rss_table = "\n".join(
        [
            "| peak RSS | MiB |",
            "|---|---:|",
            "| ours, after `register` (engine + server up) | "
            f"{ours['rss_after_register_mib']:.0f} |",
            f"| ours, after the RL steps | {ours['rss_after_rl_mib']:.0f} |",
            f"| ours, at the end (+ packing trainer, swap steps) | {ours['rss_end_mib']:.0f} |",
            f"| TRL child, after imports | {trl_res['rss_after_imports_mib']:.0f} |",
            f"| TRL child, at the end | {trl_res['peak_rss_mib']:.0f} |",
        ]
    )

    machine = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "trl_torch_threads": trl_res["torch_threads"],
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl_res["trl"],
        "cuda": torch.cuda.is_available(),
    }
    header = (
        f"machine: {machine['cpu_count']} cores ({machine['torch_threads']} torch threads), cpu, "
        f"torch {machine['torch']}, transformers {machine['transformers']}, trl {machine['trl']}; "
        f"settings: tiny preset, LoRA r=8 α=16, {p} prompts × {g} completions × {c} tokens "
        f"(prompts {min(ours['prompt_tokens'])}-{max(ours['prompt_tokens'])} tokens), "
        f"lr {LR:g}, {args.warmup} warm-up + {args.steps} timed steps (median); packing: "
        f"{pk['sequences']} sequences of 20-400 tokens ({pk['tokens']} tokens), "
        f"{args.pack_repeats} repeats (median)"
    )
    target_lines = [
        f"target ours/TRL ≤ {TARGETS['ours_over_trl']:g}: {ratio:.2f} "
        f"({'met' if ratio <= TARGETS['ours_over_trl'] else 'MISSED'})",
        f"target swap median ≤ {TARGETS['swap_median_ms']:g} ms: {median(first):.1f} ms "
        f"({'met' if median(first) <= TARGETS['swap_median_ms'] else 'MISSED'})",
    ]
    markdown = "\n\n".join([rl_table, ours_parts, pk_table, swap_table, rss_table])
    return {
        "benchmark": "rl_step",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": {
            "prompts": p,
            "group_size": g,
            "completion_tokens": c,
            "steps": args.steps,
            "warmup": args.warmup,
            "swap_steps": args.swap_steps,
            "pack_seqs": args.pack_seqs,
            "pack_repeats": args.pack_repeats,
            "seed": args.seed,
            "learning_rate": LR,
            "model": "tiny",
            "prompt_tokens": ours["prompt_tokens"],
        },
        "machine": machine,
        "targets": TARGETS,
        "rl_step": {
            **{f"ours_{k}": v for k, v in rl.items()},
            "trl": {"s_per_step": trl_s, "best_s": min(trl_timed), "generation_s": trl_gen},
            "ours_over_trl": ratio,
        },
        "swap": {
            "first_request_median_ms": median(first),
            "first_request_max_ms": max(first),
            "steady_median_ms": median(steady),
            "swap_seconds_median_ms": median(load),
            "swap_seconds_max_ms": max(load),
        },
        "packing": pk,
        "ours": ours,
        "trl": trl_res,
        "peak_rss_mib": {
            "ours_after_rl": ours["rss_after_rl_mib"],
            "ours_end": ours["rss_end_mib"],
            "trl": trl_res["peak_rss_mib"],
        },
        "bench_seconds": args.bench_seconds,
        "header": header,
        "markdown": markdown,
        "target_lines": target_lines,
    }


async def ours_and_trl(
    args: argparse.Namespace, tmpdir: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    print("starting TRL GRPOTrainer in a child process...", file=sys.stderr, flush=True)
    trl = await TrlChild.start(args)
    try:
        ours = await run_ours(args, tmpdir, trl)
        return ours, await trl.finish()
    finally:
        trl.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="prompts (groups) per step, P")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt, G")
    ap.add_argument("--completion-tokens", type=int, default=32, help="tokens per completion, C")
    ap.add_argument("--steps", type=int, default=3, help="timed RL steps per side (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed RL steps first")
    ap.add_argument("--swap-steps", type=int, default=5, help="extra steps to time the swap")
    ap.add_argument("--pack-seqs", type=int, default=48, help="sequences for the packing test")
    ap.add_argument("--pack-repeats", type=int, default=3, help="timed rounds of the packing test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    ap.add_argument(
        "--only",
        choices=["all", "trl", "ours"],
        default="all",
        help="all (default); trl: TRL's steps alone; ours: our RL steps alone (for profiling)",
    )
    ap.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--lockstep", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if (
        min(args.prompts, args.group_size, args.completion_tokens, args.steps) < 1
        or min(args.warmup, args.swap_steps, args.pack_repeats - 1) < 0
        or args.pack_seqs < 1
        or args.group_size < 2
    ):
        ap.error("sizes and --steps must be >= 1 (--group-size >= 2), --warmup/--swap-steps >= 0")
    torch.manual_seed(args.seed)
    if args.only == "trl":
        res = run_trl(args)
        if args.json_out is None:
            print(json.dumps(res, indent=2))
        else:
            write_results(args.json_out, res)
        return

    if args.only == "ours":  # for profiling: our RL steps alone, nothing saved
        with tempfile.TemporaryDirectory(prefix="rl_step.") as tmpdir:
            print(json.dumps(asyncio.run(run_ours(args, tmpdir))["steps"], indent=2))
        return

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rl_step.") as tmpdir:
        ours, trl_res = asyncio.run(ours_and_trl(args, tmpdir))
    pk = run_packing(args)
    ours["rss_end_mib"] = peak_rss_mib()
    args.bench_seconds = time.perf_counter() - t_start
    result = report(args, trl_res, ours, pk)
    print(result["header"])
    print()
    print(result["markdown"])
    print()
    for line in result["target_lines"]:
        print(line)
    write_results(args.out, result)
    print(f"saved {args.out} ({args.bench_seconds:.0f} s)")
    if args.out == RESULTS:
        block = "\n".join([result["header"], "", result["markdown"], "", *result["target_lines"]])
        if update_readme("rl_step", block):
            print("updated README.md")


if __name__ == "__main__":
    main()
