"""Agent rollouts with and without a prefix cache, on the real preset, three engines side by side.

Settings, each in a child process of its own (so each peak RSS is its own), one after
another in one run:

- `torch-nocache`: our torch engine, prefix cache off (`prefix_cache_bytes=0`);
- `torch-cache`: our torch engine with its prefix cache (the default);
- `torch-head`: our torch engine with its prefix cache and a batch head (the shared system
  prompt and tools held once: `TorchEngineConfig.batch_head=True`);
- `vllm`: vLLM's CPU build with its automatic prefix caching (`VLLMEngineConfig`'s default);
- `torch-head-noguess` (not run by default): `torch-head` without speculative tokens
  (`speculative_tokens=0`; the other torch settings guess, as the engine does by default).

All in `--dtype`, the same for both engines; `auto` (the default): bfloat16 where the CPU
multiplies it in hardware (AMX, AVX-512-BF16), float32 elsewhere. Each setting measures:

1. **Next turn vs fresh prompt**: a conversation of about `--conv-tokens` tokens (1,700)
   answered with 1 token, fresh (nothing of it served before), and the next turn of a
   conversation served just before (its prompt, the model's own 16-token reply, a short
   user turn), answered with 1 token. Token ids straight to the engine; median of 3.
2. **One RL step's rollouts**: `--rollouts` (16) rollouts of the `art-mcp` harness's own
   agent (its system prompt, the bundled MCP server's tools and `complete_task`, forced
   tool calls, up to `--max-turns` turns, temperature 0.8), `--group-size` per scenario,
   all at once as `gather_trajectory_groups` runs them. Reported: wall time, prompt
   tokens served vs computed (the rest came from the cache), hit rate, completion tokens
   per second of wall time, the trainer's `prefix_breaks` over the rollouts' calls.

Optionally (`--step`), **one whole RL step** on the torch engine with the cache: 8 groups
x 4 rollouts, 3 turns, then `model.train` (bf16 autocast); its rollout and train seconds,
and the trainer's processed tokens per second against this CPU's bf16 matmul limit,
measured here with a plain matmul (the CPU's MFU, counting 4 x params x tokens: forward
and the backward to activations; LoRA's own weight gradients are negligible).

    .venv/bin/python -m bench.agent_rollouts [--settings torch-nocache,torch-cache,vllm] [--step]

Left out: GPUs, and vLLM's chunked prefill settings (its defaults are kept).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.memory import tree_peak_rss_mib
from bench.readme import ROOT, results_dir, update_docs, write_results


def host_name(flags: set[str]) -> str:
    """This result's name by host class (`bench.learning.host_key` of the CPU's flags), so
    that one class's run never overwrites another's: "agent_rollouts" on AVX2 (the first
    table), else with "_amx" or "_avx512bf16" added; the file under
    bench/results/agent_rollouts and the docs block."""
    from bench.learning import host_key

    key = host_key(" ".join(sorted(flags)))
    return "agent_rollouts" if key == "avx2" else f"agent_rollouts_{key}"


SETTINGS = ("torch-nocache", "torch-cache", "torch-head", "vllm")


def _conversation(tokenizer: Any, n_tokens: int, tag: str) -> list[int]:
    """Token ids of a chat of about `n_tokens` tokens ending in a generation prompt; `tag`
    opens the system prompt, so two tags share nothing."""
    facts = [
        "The river runs north past the old mill.",
        "Bread is baked at dawn in the square.",
        "Trains leave every hour for the coast.",
        "The library keeps maps of every valley.",
    ]
    messages: list[dict[str, str]] = [
        {"role": "system", "content": f"{tag}: you are a helpful assistant for a small town."}
    ]
    i = 0
    while True:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer.encode(str(text), add_special_tokens=False))
        if len(ids) >= n_tokens:
            return ids
        messages.append({"role": "user", "content": f"Tell me fact {i}. " + facts[i % 4] * 3})
        messages.append({"role": "assistant", "content": f"Fact {i}: " + facts[(i + 1) % 4] * 2})
        i += 1


async def _turns(engine: Any, tokenizer: Any, n_tokens: int) -> dict[str, float]:
    from art_langgraph.engine import SamplingParams

    one = SamplingParams(max_tokens=1, temperature=0)
    reply = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    turn = tokenizer.apply_chat_template(
        [{"role": "user", "content": "And the next one?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    user = list(tokenizer.encode("\n" + str(turn), add_special_tokens=False))
    fresh, nxt, cached = [], [], []
    for k in range(3):
        t0 = time.perf_counter()
        await engine.generate(_conversation(tokenizer, n_tokens, f"fresh {k}"), one)
        fresh.append(time.perf_counter() - t0)
        conv = _conversation(tokenizer, n_tokens, f"chat {k}")
        r = await engine.generate(conv, reply)
        t0 = time.perf_counter()
        r2 = await engine.generate(conv + r.completion_token_ids + user, one)
        nxt.append(time.perf_counter() - t0)
        cached.append(r2.cached_tokens)
    f, n = statistics.median(fresh), statistics.median(nxt)
    return {
        "conv_tokens": float(len(_conversation(tokenizer, n_tokens, "fresh 0"))),
        "fresh_s": f,
        "next_turn_s": n,
        "next_over_fresh": n / f,
        "next_turn_cached_tokens": float(statistics.median(cached)),
        "fresh_prefill_tok_s": n_tokens / f,
    }


def _matmul_peak_tflops(dtype: str) -> float:
    """This CPU's dense matmul rate in `dtype` (TFLOP/s), best of a few 2048^3 products."""
    import torch

    dt_ = getattr(torch, dtype)
    a = torch.randn(2048, 2048).to(dt_)
    b = torch.randn(2048, 2048).to(dt_)
    best = float("inf")
    for _ in range(6):
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        best = min(best, (time.perf_counter() - t0) / 4)
    return 2 * 2048**3 / best / 1e12


async def _rollouts(
    model: Any, groups: int, group_size: int, max_turns: int, step: bool
) -> dict[str, Any]:
    import art_langgraph as art
    from art_langgraph.training.tensorize import build_sequences
    from art_mcp import MCPToolset
    from art_mcp.agent import SYSTEM, complete_task_tool, final_answer, force_tool_calls
    from art_mcp.scenarios import load_scenarios

    scenarios = load_scenarios(ROOT / "examples/mcp_server/scenarios.jsonl")[:groups]
    from examples.mcp_server.tasks import score

    toolset = MCPToolset(f"{sys.executable} -m examples.mcp_server.server")
    await toolset.start()
    try:
        from langchain.agents import create_agent

        tools = [*toolset.langchain_tools(), complete_task_tool()]
        agent = create_agent(
            model.chat_model(max_tokens=96, temperature=0.8),
            tools=tools,
            system_prompt=SYSTEM,
            middleware=[force_tool_calls()],
        )

        async def rollout(s: Any) -> art.Trajectory:
            with art.capture(metadata={"scenario": s.id}) as traj:
                try:
                    await agent.ainvoke(
                        {"messages": [("user", s.task)]}, {"recursion_limit": 2 * max_turns + 1}
                    )
                except Exception as exc:  # out of turns: a rollout like any other
                    traj.log(f"rollout stopped: {exc!r}")
            traj.metadata["answer"] = final_answer(traj)
            traj.reward = float(score(traj, s))
            return traj

        t0 = time.perf_counter()
        got = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(s) for _ in range(group_size)) for s in scenarios),
            progress=False,
        )
        wall = time.perf_counter() - t0
        calls = breaks = 0
        for g in got:
            for t in g.trajectories:
                _, stats = build_sequences(t, 0.0, max_seq_length=1 << 20)
                calls += stats.calls
                breaks += stats.prefix_breaks
        out: dict[str, Any] = {
            "rollout_s": wall,
            "calls": calls,
            "prefix_breaks": breaks,
            "reward": statistics.fmean(t.reward for g in got for t in g.trajectories),
        }
        if step:
            t0 = time.perf_counter()
            # micro-batches of 2,048 tokens, as `./scripts/demo.sh --real` trains
            res = await model.train(got, art.TrainConfig(micro_batch_tokens=2048))
            out["train_s"] = time.perf_counter() - t0
            out["train_metrics"] = res.metrics
        return out
    finally:
        await toolset.close()


async def _one(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    import art_langgraph as art
    from art_langgraph.engine import SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        if setting == "vllm":
            from art_langgraph.engine.vllm_engine import VLLMEngineConfig

            kind, config = "vllm", VLLMEngineConfig(dtype=args.dtype)
        else:
            from art_langgraph.engine import TorchEngineConfig

            budget = 0 if setting == "torch-nocache" else None
            dtype = None if args.dtype == "auto" else args.dtype
            head = setting in ("torch-head", "torch-head-noguess")
            guesses = 0 if setting.endswith("-noguess") else TorchEngineConfig.speculative_tokens
            kind, config = (
                "torch",
                TorchEngineConfig(
                    dtype=dtype,
                    prefix_cache_bytes=budget,
                    batch_head=head,
                    speculative_tokens=guesses,
                ),
            )
        t0 = time.perf_counter()
        async with art.LocalBackend(
            path=tmp, engine=art.EngineChoice(kind, config=config)
        ) as backend:
            model = art.TrainableModel(
                name="bench",
                project="bench",
                base_model="smollm2-135m",
                training=art.ModelConfig(compute_dtype=args.dtype),
            )
            await model.register(backend)
            engine = backend.engine
            tok = engine.tokenizer
            start_s = time.perf_counter() - t0
            # warm-up on text no measured request shares
            await engine.generate(tok.encode("warm up " * 50), SamplingParams(max_tokens=4))
            row: dict[str, Any] = {"setting": setting, "start_s": start_s}
            row.update(await _turns(engine, tok, args.conv_tokens))
            m0 = engine.metrics()
            row.update(
                await _rollouts(
                    model,
                    args.rollouts // args.group_size,
                    args.group_size,
                    args.max_turns,
                    False,
                )
            )
            m1 = engine.metrics()
            served = m1.prompt_tokens - m0.prompt_tokens
            hits = m1.prefix_cache_hits - m0.prefix_cache_hits
            row.update(
                prompt_tokens=served,
                prompt_tokens_computed=served - hits,
                hit_rate=hits / served if served else 0.0,
                completion_tokens=m1.generation_tokens - m0.generation_tokens,
                completion_tok_s=(m1.generation_tokens - m0.generation_tokens) / row["rollout_s"],
                cache_mib=m1.prefix_cache_bytes / 2**20,
            )
            # this process and its children: the torch engine is in-process, vLLM's server
            # tree is our child
            row["peak_rss_mib"] = tree_peak_rss_mib(os.getpid())
            if args.step and setting == "torch-cache":
                step = await _rollouts(model, 8, 4, 3, True)
                step["peak_rss_mib"] = tree_peak_rss_mib(os.getpid())
                row["step"] = step
    return row


def _table(rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["setting"] == "torch-nocache"), rows[0])
    vllm = next((r for r in rows if r["setting"] == "vllm"), None)
    lines = [
        "| setting | rollouts (s) | vs cache off | vs vLLM | prompt tokens computed / served | "
        "hit rate | completion tok/s | prefix breaks / calls | fresh 1.7k (s) | next turn (s) | "
        "next / fresh | fresh prefill vs vLLM | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs_v = f"{vllm['rollout_s'] / r['rollout_s']:.2f}x" if vllm else "–"
        pre_v = f"{vllm['fresh_s'] / r['fresh_s']:.2f}x" if vllm else "–"
        lines.append(
            f"| {r['setting']} | {r['rollout_s']:.1f} | {base['rollout_s'] / r['rollout_s']:.2f}x | "
            f"{vs_v} | {r['prompt_tokens_computed']:,} / {r['prompt_tokens']:,} | "
            f"{r['hit_rate']:.0%} | {r['completion_tok_s']:.1f} | "
            f"{r['prefix_breaks']} / {r['calls']} | {r['fresh_s']:.2f} | {r['next_turn_s']:.3f} | "
            f"{r['next_over_fresh']:.2f} | {pre_v} | {r['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--rollouts", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--conv-tokens", type=int, default=1700)
    p.add_argument("--step", action="store_true", help="also one whole RL step (torch-cache)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    from art_langgraph.runtime.allocator import reexec_with_tcmalloc
    from art_langgraph.runtime.devices import cpu_flags, cpu_has_fast_bf16, matmul_flags

    reexec_with_tcmalloc()  # as art-mcp runs (art_langgraph/runtime/allocator.py); children inherit it

    fast = cpu_has_fast_bf16()
    if args.dtype == "auto":  # both engines at the same dtype: this CPU's fast one
        args.dtype = "bfloat16" if fast else "float32"
    if args.one:
        row = asyncio.run(_one(args.one, args))
        Path(args.out).write_text(json.dumps(row))
        return
    rows = []
    for setting in args.settings.split(","):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "bench.agent_rollouts", "--one", setting, "--out", f.name]
            for k in ("dtype", "rollouts", "group_size", "max_turns", "conv_tokens"):
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            cmd += ["--step"] if args.step else []
            print(f"running {setting} ...", flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT)
            rows.append(json.loads(Path(f.name).read_text()))
        print(json.dumps(rows[-1], indent=1, default=str)[:2000], flush=True)
    extra = ""
    step = next((r["step"] for r in rows if "step" in r), None)
    resolved = args.dtype
    if step is not None:
        peak = _matmul_peak_tflops(resolved)
        m = step["train_metrics"]
        tokens = m.get("trainable_tokens", 0) + m.get("shared_prefix_tokens", 0)
        n_params = 134.5e6 - 28.3e6  # SmolLM2-135M without its (tied) embedding matrix
        achieved = 4 * n_params * m.get("train_tokens_per_s", 0) / 1e12
        step.update(matmul_peak_tflops=peak, trainer_tflops=achieved, trainer_mfu=achieved / peak)
        extra = (
            f"\n\nOne whole RL step (torch engine with the cache, 8 groups x 4 rollouts, 3 turns, "
            f"{resolved}): rollouts {step['rollout_s']:.0f} s + train {step['train_s']:.0f} s "
            f"= {step['rollout_s'] + step['train_s']:.0f} s; the trainer processed "
            f"{m.get('train_tokens_per_s', 0):.0f} tokens/s ({tokens:.0f} tokens, of which "
            f"{m.get('trainable_tokens', 0):.0f} trainable), {achieved:.2f} TFLOP/s against "
            f"this CPU's {peak:.2f} TFLOP/s {resolved} matmul: {achieved / peak:.0%} of peak. "
            f"Peak RSS with the step: {step.get('peak_rss_mib', 0):.0f} MiB."
        )
    table = (
        f"{os.cpu_count()} cores, CPU flags {matmul_flags()}, both engines in {args.dtype}\n\n"
        + _table(rows)
        + extra
    )
    print(table)
    name = host_name(cpu_flags())
    write_results(
        results_dir("agent_rollouts") / f"{name}.json",
        {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "args": vars(args),
            "hardware_bf16": fast,
            "cpu_flags": matmul_flags(),
            "rows": rows,
            "table": table,
        },
    )
    update_docs(name, table)


if __name__ == "__main__":
    main()
