"""Shared parts of the RL-step benchmark: prompts, reward, sizes, RSS, medians."""

from __future__ import annotations

import math
import resource
import statistics
from typing import Any

from bench.readme import results_dir

RESULTS = results_dir("rl_step") / "rl_step.json"

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
    "boxing matches near the river bank and every sailor counts stars before dawn"
).split()

TARGETS = {"ours_over_trl": 0.8, "swap_median_ms": 50.0}
"""ours / TRL seconds per step at most 0.8; what the swap adds to the first request on the
new step (median, over the same request again) at most 50 ms."""

LR = 1e-5

PROTOCOL = "@@rl_step"
"""Prefix of the lines the TRL child and the parent exchange on its stdin/stdout."""

STEP_METRICS = (
    "train_seconds",
    "swap_seconds",
    "step_seconds",
    "train_tokens_per_s",
    "padding_waste",
    "shared_prefix_tokens",
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
