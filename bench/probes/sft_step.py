"""One SFT warm-start step on the real preset: its matmul dtype and activation budget.

The warm start (`train_sft`) trains a task's demonstrations in batches of 8; with a long
shared head (the system prompt and tool specs, 708 of a capitals demonstration's 808
tokens) each batch is one prefix tree of ~1,500 tokens, whose activations exceed the
trainer's 256 MiB budget, so "auto" checkpointing recomputes nearly every layer. Arms,
each in a child process of its own (so each peak RSS is its own; on tcmalloc, as `art-mcp`
runs), on the capitals task's
first 64 demonstrations as the harness renders them (its server started for the tool
specs), 8 steps of 8 at the warm start's learning rate (the first untimed):

- the SFT step's matmul dtype (`TrainConfig.sft_compute_dtype`): `model` (the trainer's:
  float32 for SmolLM2-135M here) or `bfloat16` (autocast over the float32 weights);
- the SFT step's activation budget (`activations.SFT_CHECKPOINT_BYTES`, which the arm's
  process sets): 256 MiB (the RL steps' budget, which SFT steps took until this probe
  chose 1 GiB for them), 1 GiB (their default now), or none (nothing recomputed);
- with a further field `frozen`: the tree's shared root without gradient
  (`TrainConfig.sft_frozen_root`), e.g. `model:1024:frozen`;
- with a further field `plain`: micro-batches at their own widths, where a bfloat16 step
  on the CPU pads them to one of few (`micro_batches`' `bucket_width`), e.g.
  `bfloat16:1024:plain`.

`--epochs N` runs the demonstrations N times, reshuffled after the first (as a warm start
does), and the table gives the RSS after the first and the last step: oneDNN keeps a
kernel, with its buffers, for each row count its bfloat16 matmuls meet, so a process
that meets a new width every step grows step by step.

It prints median step time against the first arm's (model, 256 MiB), the layers the
last step recomputed, peak RSS (the trainer alone, with its own copy of the weights: in a
run it shares the engine's), and each step's loss: the budget changes no result, the dtype
does.

    .venv/bin/python -m bench.probes.sft_step [--arms model:256,bfloat16:1024]

Left out: what the dtype does to what is learned (bench.warm_stop's `--compute-dtype`
arms evaluate it held-out), GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.learning import host_key
from bench.readme import publish, results_dir
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("sft_step") / f"sft_step_{host_key(cpu_flags())}.json"
ARMS = ("model:256", "model:1024", "bfloat16:256", "bfloat16:1024", "bfloat16:inf")
"""dtype:budget in MiB (inf: nothing recomputed)[:frozen]; the first is the reference (the step as it
was before this probe), the second the default."""


def demonstrations(n: int) -> list[Any]:
    """The capitals task's first `n` demonstrations as the harness renders them."""
    from art_mcp.agent import complete_task_tool, demonstrations
    from art_mcp.scenarios import load_scenarios
    from art_mcp.toolset import MCPToolset

    async def tools() -> list[Any]:
        async with MCPToolset(f"{sys.executable} -m examples.mcp_server.server") as ts:
            return [*ts.langchain_tools(), complete_task_tool()]

    scen = [s for s in load_scenarios("examples/mcp_server/scenarios.jsonl") if s.demonstration]
    return demonstrations(None, scen[:n], asyncio.run(tools()))


def child(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    from art_langgraph.presets.resolve import resolve_preset
    from art_langgraph.training import activations
    from art_langgraph.training import trainer as trainer_module
    from art_langgraph.training.config import ModelConfig, TrainConfig
    from art_langgraph.training.sft import sft_sequences
    from art_langgraph.training.tensorize import micro_batches
    from art_langgraph.training.trainer import LoRATrainer

    dtype, budget, *flags = arm.split(":")
    activations.SFT_CHECKPOINT_BYTES = 2**62 if budget == "inf" else int(budget) * 2**20  # type: ignore[misc]
    if "plain" in flags:  # the widths as they come, whatever the trainer asks

        def plain(*a: Any, **kw: Any) -> Any:
            return micro_batches(*a, **{**kw, "bucket_width": False})

        trainer_module.micro_batches = plain  # type: ignore[attr-defined]
    trainer = LoRATrainer(resolve_preset("smollm2-135m"), ModelConfig(), "cpu")
    seqs, _ = sft_sequences(trainer.tokenizer, demonstrations(args.steps * 8), 4096)
    config = TrainConfig(  # the warm start's rate
        learning_rate=3e-3, sft_compute_dtype=dtype, sft_frozen_root="frozen" in flags
    )
    times, losses, rss = [], [], []
    order = list(range(len(seqs)))
    for epoch in range(args.epochs):
        if epoch:
            random.Random(epoch).shuffle(order)
        for i in range(0, len(order), 8):
            t0 = time.perf_counter()
            losses.append(trainer.sft_step([seqs[j] for j in order[i : i + 8]], config)["loss"])
            times.append(time.perf_counter() - t0)
            rss.append(_rss_mib())
    return {
        "arm": arm,
        "median_s": statistics.median(times[1:]),
        "recomputed": sum(bool(m.gradient_checkpointing) for m in trainer._checkpointed),
        "layers": len(trainer._checkpointed),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_mib": rss,
        "losses": losses,
    }


def _rss_mib() -> float:
    """This process's resident memory now, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--steps", type=int, default=8, help="steps of 8 demonstrations an epoch")
    p.add_argument("--epochs", type=int, default=1, help="passes over the demonstrations")
    p.add_argument("--tag", default="", help="a suffix for the results file and docs block")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        from art_langgraph.runtime.allocator import allocator_in_use, reexec_with_tcmalloc

        reexec_with_tcmalloc()  # as art-mcp runs (art_langgraph/runtime/allocator.py)
        print(json.dumps({**child(args.child, args), "allocator": allocator_in_use()}))
        return
    rows = []
    for arm in args.arms.split(","):
        cmd = [sys.executable, "-m", "bench.probes.sft_step", "--child", arm]
        cmd += ["--steps", str(args.steps), "--epochs", str(args.epochs)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"arm {arm} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    ref = rows[0]["median_s"]
    lines = [
        f"One SFT step of 8 capitals demonstrations (SmolLM2-135M, float32 weights, LoRA; "
        f"{args.steps} steps an epoch, {args.epochs} epoch(s), the first step untimed; "
        f"allocator {rows[0]['allocator']}); host CPU flags {cpu_flags()}.",
        "",
        "| dtype:budget MiB (then :frozen root, :plain widths) | median step s | vs the first | "
        "layers recomputed | peak RSS MiB | RSS after the first -> last step MiB | "
        "loss, first -> last step |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['median_s']:.1f} | {r['median_s'] / ref:.2f}x | "
            f"{r['recomputed']} of {r['layers']} | {r['peak_rss_mib']:.0f} | "
            f"{r['rss_mib'][0]:.0f} -> {r['rss_mib'][-1]:.0f} | "
            f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f} |"
        )
    name = "sft_step" + (f"_{args.tag}" if args.tag else "")
    path = RESULTS.with_name(RESULTS.stem + (f"_{args.tag}" if args.tag else "") + ".json")
    publish(name, path, lines, args, rows=rows)


if __name__ == "__main__":
    main()
