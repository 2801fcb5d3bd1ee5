"""Our side: `LocalBackend` + `TrainableModel` RL steps, alternating variants, timing swaps."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from typing import Any

from bench.rl_step.common import (
    LR,
    STEP_METRICS,
    BatchShapes,
    describe,
    make_prompts,
    peak_rss_mib,
    reward,
)
from bench.rl_step.trl_side import TrlChild


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
        base_model=args.base_model,
        training=art.ModelConfig(lora_r=8, lora_alpha=16),
    )
    t_reg = time.perf_counter()
    await model.register(backend)
    register_s = time.perf_counter() - t_reg
    rss_register = peak_rss_mib()
    client = model.openai_client(max_retries=0, timeout=300)
    configs = {
        "default": art.TrainConfig(learning_rate=LR),
        "unshared": art.TrainConfig(learning_rate=LR, share_prefixes=False),
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
            # what capture() asks for: ids and their logprobs as plain lists
            extra_body={
                "return_token_ids": True,
                "return_token_logprobs": True,
                "ignore_eos": True,
            },
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
        trainer = backend._runs["m"].trainer
        out["trainer_shares_base"] = bool(trainer is not None and trainer.shares_base)
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
