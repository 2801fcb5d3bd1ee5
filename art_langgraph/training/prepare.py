"""One GRPO step's input: trajectory groups -> training sequences and step metrics.

`prepare_step` is pure (no model, no disk) and shared by every backend: it refuses
what cannot be trained (a non-group, a group with unfinished rollouts, token ids
outside the vocabulary), skips groups that carry no signal (empty, all rewards equal,
older than `max_staleness`) and counts each kind, computes each group's advantages, and
turns every trajectory into token-exact sequences (`tensorize.build_sequences`).

Left out: the optimizer step itself (`trainer.py`).
"""

from __future__ import annotations

import statistics
from typing import Any

from art_langgraph.errors import UsageError
from art_langgraph.training.advantages import compute_advantages, is_zero_variance
from art_langgraph.training.config import TrainConfig
from art_langgraph.training.tensorize import TensorizeStats, TrainSequence, build_sequences
from art_langgraph.trajectory import Trajectory, TrajectoryGroup

__all__ = ["prepare_step"]


def prepare_step(
    groups: list[TrajectoryGroup],
    config: TrainConfig,
    new_step: int,
    *,
    tokenizer: Any = None,
    vocab_size: int | None = None,
) -> tuple[list[TrainSequence], dict[str, float]]:
    """The sequences to train at step `new_step`, and the step's metrics (counts, rewards)."""
    if not groups:
        # A step with no groups would advance the model and write a checkpoint of nothing.
        raise UsageError(
            "train() got no groups: gather at least one TrajectoryGroup of finished rollouts "
            "(gather_trajectory_groups drops groups whose rollouts all failed: check its errors)"
        )
    counts = {"groups": 0, "empty_groups": 0, "zero_variance_groups": 0, "stale_groups": 0}
    stats = TensorizeStats()
    seqs: list[TrainSequence] = []
    rewards: list[float] = []
    for i, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup):
            raise UsageError(f"groups[{i}] is a {type(group).__name__}, not a TrajectoryGroup")
        if group.pending:
            raise UsageError(f"groups[{i}] still holds unfinished rollouts: gather it first")
        counts["groups"] += 1
        trajs = list(group)
        if not trajs:
            counts["empty_groups"] += 1
            continue
        r = group.rewards()
        rewards += r
        if (
            config.max_staleness is not None
            and _stalest(trajs) < new_step - 1 - config.max_staleness
        ):
            counts["stale_groups"] += 1
            continue
        if is_zero_variance(r):
            counts["zero_variance_groups"] += 1
            continue
        for traj, adv in zip(trajs, compute_advantages(r, config.scale_rewards), strict=True):
            s, st = build_sequences(
                traj,
                adv,
                max_seq_length=config.max_seq_length,
                tokenizer=tokenizer,
                allow_retokenize=config.allow_retokenize,
                vocab_size=vocab_size,
            )
            seqs += s
            stats.add(st)
    metrics: dict[str, float] = {k: float(v) for k, v in counts.items()}
    metrics.update({f"tensorize/{k}": float(v) for k, v in vars(stats).items()})
    if rewards:
        metrics["reward"] = statistics.fmean(rewards)
        metrics["reward_std"] = statistics.pstdev(rewards)
    metrics["trajectories"] = float(len(rewards))
    metrics["nothing_trainable"] = float(not seqs)
    return seqs, metrics


def _stalest(trajs: list[Trajectory]) -> int:
    """The oldest adapter step any trainable call of these trajectories was sampled from."""
    steps = [
        c.adapter_step for t in trajs for c in t.calls if c.trainable and c.adapter_step is not None
    ]
    return min(steps) if steps else 10**9
