"""TRL's side: `GRPOTrainer` steps in a child process, in lockstep with ours."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.rl_step.common import LR, PROTOCOL, make_prompts, peak_rss_mib, reward


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    """TRL's GRPOTrainer for warmup + steps optimizer steps; runs in the child process."""
    import transformers
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback

    import art_langgraph as art
    from art_langgraph.presets import resolve_preset

    rss_imports = peak_rss_mib()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    path = resolve_preset(args.base_model)
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
            f"--base-model={args.base_model}",
            cwd=Path(__file__).resolve().parents[2],  # the repository root
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
