"""One RL step with inference replicas and trainer ranks: R=1/W=1, R=2/W=1, R=1/W=2 (and,
with --ray, R=2/W=2 as local processes and as Ray actors).

Three embedded backends run side by side, one per layout (`LocalBackend(replicas=R,
trainer_ranks=W)`), each with its own model on the same preset. Each step is P prompts
x G concurrent chat requests of C completion tokens (`ignore_eos`) through the backend's
OpenAI endpoint, recorded with `LLMCall.from_openai`, then `model.train(groups)`. The
layouts take turns step by step (the first one rotates), so a shared machine's noise
falls on all of them; after `--warmup` untimed steps each, `--steps` timed ones.

Reported per layout: median seconds per step, and each phase's share: rollouts
(generation), training (the trainer's step: tensorize, forward/backward, optimizer), and
the swap (checkpoint written, adapter loaded into every replica); with the ratio of the
step to R=1/W=1's.

On a machine of 2 CPU cores, replicas and ranks share the same cores: this measures what
the layouts cost here (processes, all-reduce, routing), not what they gain on several
devices; docs/scale-out.md says what is measured and what is arithmetic.

    .venv/bin/python -m bench.probes.scale_step [--preset tiny|smollm2-135m] [--steps 5] [--ray]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import art_langgraph as art
from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("scale_step")
LAYOUTS = [(1, 1, False), (2, 1, False), (1, 2, False)]
RAY_LAYOUTS = [(2, 2, False), (2, 2, True)]
"""With --ray: R=2/W=2 as local processes, and the same as actors on a local Ray instance."""


def _name(r: int, w: int, ray: bool) -> str:
    return f"R={r} W={w}" + (" on Ray" if ray else "")


async def _step(
    model: art.TrainableModel, prompts: list[str], group_size: int, tokens: int
) -> dict[str, float]:
    client = model.openai_client(max_retries=0)

    async def one(prompt: str, i: int) -> art.Trajectory:
        kw: dict[str, Any] = {
            "model": model.name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens,
            "temperature": 1.0,
            "logprobs": True,
            "extra_body": {"ignore_eos": True, "return_token_ids": True},
        }
        r = await client.chat.completions.create(**kw)
        call = art.LLMCall.from_openai(kw, r)
        text = r.choices[0].message.content or ""
        reward = sum(ch in "aeiou" for ch in text) / max(len(text), 1) + 0.01 * (i % 2)
        return art.Trajectory(messages=call.to_messages(), calls=[call], reward=reward)

    t0 = time.perf_counter()
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(one(p, i) for i in range(group_size)) for p in prompts),
        progress=False,
    )
    t1 = time.perf_counter()
    result = await model.train(groups, art.TrainConfig(learning_rate=1e-4))
    t2 = time.perf_counter()
    swap = float(result.metrics.get("swap_seconds", 0.0))
    return {
        "wall_s": t2 - t0,
        "gen_s": t1 - t0,
        "train_s": max(t2 - t1 - swap, 0.0),
        "swap_s": swap,
        "step": float(result.step),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = [
        f"Task {i}: tell a story about " + "word " * (6 + 5 * i) for i in range(args.prompts)
    ]
    layouts = LAYOUTS + (RAY_LAYOUTS if args.ray else [])
    steps: dict[str, list[dict[str, float]]] = {_name(*lay): [] for lay in layouts}
    with tempfile.TemporaryDirectory() as d:
        backends = []
        try:
            models = {}
            for r, w, ray in layouts:
                tag = f"r{r}w{w}" + ("ray" if ray else "")
                backend = art.LocalBackend(
                    Path(d) / tag,
                    replicas=r,
                    trainer_ranks=w,
                    ray="local" if ray else None,
                    engine="torch" if ray else "auto",
                )
                await backend.__aenter__()
                backends.append(backend)
                model = art.TrainableModel(name=tag, project="scale", base_model=args.preset)
                await model.register(backend)
                models[_name(r, w, ray)] = model
            names = list(models)
            for i in range(args.warmup + args.steps):
                order = names[i % len(names) :] + names[: i % len(names)]
                for name in order:
                    s = await _step(models[name], prompts, args.group_size, args.completion_tokens)
                    s["warmup"] = float(i < args.warmup)
                    steps[name].append(s)
                    print(f"{name}: step {int(s['step'])} {s['wall_s']:.2f} s", flush=True)
        finally:
            for backend in backends:
                await backend.__aexit__(None, None, None)
    return {"steps": steps}


def report(args: argparse.Namespace, res: dict[str, Any]) -> dict[str, Any]:
    med: dict[str, dict[str, float]] = {}
    for name, rows in res["steps"].items():
        timed = [s for s in rows if not s["warmup"]]
        med[name] = {
            k: statistics.median(s[k] for s in timed)
            for k in ("wall_s", "gen_s", "train_s", "swap_s")
        }
    base = med["R=1 W=1"]["wall_s"]
    lines = [
        f"machine: {os.cpu_count()} CPU cores, no GPU, Python {platform.python_version()}; preset "
        f"{args.preset}; {args.prompts} prompts x {args.group_size} rollouts x "
        f"{args.completion_tokens} tokens; median of {args.steps} steps after {args.warmup} warm-up",
        "",
        "| layout | s/step | vs R=1 W=1 | rollouts | training | swap |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in med.items():
        w = m["wall_s"]
        lines.append(
            f"| {name} | {w:.2f} | {w / base:.2f}x | {m['gen_s'] / w:.0%} | "
            f"{m['train_s'] / w:.0%} | {m['swap_s'] / w:.0%} |"
        )
    lines += [
        "",
        "R: inference replicas (each a process with its own weights), W: trainer ranks (gloo "
        "all-reduce); on Ray: the same as Ray actors on a local Ray instance (its own "
        "processes, placement and health checks included). Every layout runs on the same "
        "cores: one gains here only by keeping cores busy that a single process leaves "
        "idle; it says nothing of several devices.",
    ]
    return {
        "benchmark": "scale_step",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "gpu": None},
        "settings": vars(args),
        "median": med,
        "raw": res,
        "markdown": "\n".join(lines),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--completion-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--ray", action="store_true", help="add R=2/W=2, locally and on Ray")
    a = p.parse_args()
    r = report(a, asyncio.run(run(a)))
    print(r["markdown"])
    name = "scale_step" if a.preset == "tiny" else f"scale_step_{a.preset}"
    write_results(RESULTS / f"{name}.json", r)
    if update_docs(name, r["markdown"]):
        print("updated docs/benchmarks.md")


if __name__ == "__main__":
    main()
