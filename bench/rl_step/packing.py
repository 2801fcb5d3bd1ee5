"""Trainer tokens/s with and without sequence packing on the same sequences."""

from __future__ import annotations

import argparse
import math
import random
import sys
from typing import Any

from bench.rl_step.common import LR, BatchShapes, describe, median


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
    from art_langgraph.presets import resolve_preset
    from art_langgraph.training.trainer import LoRATrainer

    trainer = LoRATrainer(
        resolve_preset(args.base_model), art.ModelConfig(lora_r=8, lora_alpha=16), "cpu"
    )
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
