"""One GRPO step's input: trajectory groups -> training sequences and step metrics.

`prepare_step` is pure (no model, no disk) and shared by every backend: it refuses
what cannot be trained (a non-group, a group with unfinished rollouts, a trajectory
still waiting for its reward (`late_rewards.py`), token ids outside the vocabulary),
skips groups that carry no signal (empty, all rewards equal, older than
`max_staleness`) and counts each kind (with `signal_share_scale`, scaling the step's
advantages by the share of rollouts that carry a signal; with `flat_groups`, training
the groups of one reward, or those above the step's mean, against the whole step
(`compute_advantages` over all its rewards) instead of skipping them), warns about
rollouts that train but may not be meant to (`check_step_rollouts`: a `train_nodes` name
no rollout ran, a run still waiting at an interrupt), computes each group's advantages
(per node too, where trajectories carry `node_rewards`: `node_advantages`; with
`repeated_calls="at_most_zero"`, a call that only repeats earlier tool calls never above
0: `cap_repeated_calls`), turns every
trajectory into token-exact sequences (`tensorize.build_sequences`), and trains identical
ones once, weighed by their count (`tensorize.merge_duplicates`; `duplicate_sequences`
counts those merged away).

Left out: the optimizer step itself (`trainer.py`).
"""

from __future__ import annotations

import dataclasses
import statistics
import warnings
from collections.abc import Collection, Sequence
from typing import Any

from art_langgraph.errors import UsageError
from art_langgraph.training.advantages import compute_advantages, is_zero_variance
from art_langgraph.training.config import TrainConfig
from art_langgraph.training.tensorize import (
    TensorizeStats,
    TrainSequence,
    build_sequences,
    merge_duplicates,
)
from art_langgraph.trajectories.late_rewards import check_no_pending
from art_langgraph.trajectories.tool_calls import tool_call_key
from art_langgraph.trajectories.trajectory import (
    TRAIN_NODES_KEY,
    LLMCall,
    Trajectory,
    TrajectoryGroup,
)


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
    counts = {
        "groups": 0,
        "empty_groups": 0,
        "zero_variance_groups": 0,
        "flat_groups_trained": 0,
        "stale_groups": 0,
        "node_advantage_calls": 0,
        "repeated_calls_zeroed": 0,
    }
    check_no_pending([g for g in groups if isinstance(g, TrajectoryGroup)])
    counts.update(check_step_rollouts([g for g in groups if isinstance(g, TrajectoryGroup)]))
    rewards: list[float] = []
    # (trajectories, their advantages, per-call advantages) of each group that trains
    trained: list[tuple[list[Trajectory], list[float], dict[str, float]]] = []
    flat: list[tuple[list[Trajectory], list[float]]] = []  # groups with no signal of their own
    rollouts = signal = 0  # rollouts of the groups that were not empty or stale; with signal
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
        per_call, node_signal = node_advantages(trajs, config.scale_rewards)
        rollouts += len(trajs)
        if is_zero_variance(r) and not node_signal:
            flat.append((trajs, r))
            continue
        counts["node_advantage_calls"] += len(per_call)
        signal += len(trajs)
        trained.append((trajs, compute_advantages(r, config.scale_rewards), per_call))
    if config.flat_groups != "skip" and flat:
        # the step's rewards, the flat groups' first: their advantages against the whole step
        step = [x for _, r in flat for x in r] + [t.reward for ts, _, _ in trained for t in ts]
        if not is_zero_variance(step):
            each = iter(compute_advantages(step, config.scale_rewards))
            against = [[next(each) for _ in r] for _, r in flat]
            keep = [config.flat_groups == "batch_baseline" or a[0] > 0 for a in against]
            # a flat group trains whole on its advantage: node rewards equal within it too
            trained += [(t, a, {}) for (t, _), a, k in zip(flat, against, keep, strict=True) if k]
            counts["flat_groups_trained"] = sum(keep)
            flat = [g for g, k in zip(flat, keep, strict=True) if not k]
    counts["zero_variance_groups"] = len(flat)
    if config.repeated_calls == "at_most_zero":
        trained = [(t, a, cap_repeated_calls(t, a, p, counts)) for t, a, p in trained]
    stats = TensorizeStats()
    seqs: list[TrainSequence] = []
    for trajs, advantages, per_call in trained:
        for traj, adv in zip(trajs, advantages, strict=True):
            s, st = build_sequences(
                traj,
                adv,
                max_seq_length=config.max_seq_length,
                tokenizer=tokenizer,
                allow_retokenize=config.allow_retokenize,
                vocab_size=vocab_size,
                call_advantages=per_call,
            )
            seqs += s
            stats.add(st)
    share = signal / rollouts if rollouts else 0.0
    if config.signal_share_scale and share < 1:
        seqs = [scale_advantages(q, share) for q in seqs]
    seqs, counts["duplicate_sequences"] = merge_duplicates(seqs)
    metrics: dict[str, float] = {k: float(v) for k, v in counts.items()}
    metrics["signal_share"] = share
    metrics.update({f"tensorize/{k}": float(v) for k, v in vars(stats).items()})
    if rewards:
        metrics["reward"] = statistics.fmean(rewards)
        metrics["reward_std"] = statistics.pstdev(rewards)
    metrics["trajectories"] = float(len(rewards))
    metrics["nothing_trainable"] = float(not seqs)
    return seqs, metrics


def scale_advantages(seq: TrainSequence, factor: float) -> TrainSequence:
    """`seq` with every advantage times `factor`: the clipped surrogate's gradient is linear
    in the advantage (its clipping depends on the ratio and the advantage's sign alone), so
    this scales the sequence's share of the loss and nothing else."""
    per_token = seq.token_advantages
    return dataclasses.replace(
        seq,
        advantage=seq.advantage * factor,
        token_advantages=None if per_token is None else [a * factor for a in per_token],
    )


def check_step_rollouts(groups: Sequence[TrajectoryGroup]) -> dict[str, int]:
    """Warn, once per step, about rollouts that train but may not be what the user meant,
    and count them for the step's metrics:

    - a `capture(train_nodes=[...])` name that matched no call of any rollout in the step
      (a typo, or a node that never calls the model), with the nodes that did;
    - trajectories still waiting at a LangGraph `interrupt()` (`interrupted`): they train
      as they stand, the calls up to the interrupt, rewarded as they are.
    """
    trajs = [t for g in groups for t in g]
    asked = {n for t in trajs for n in t.metadata.get(TRAIN_NODES_KEY) or ()}
    ran = {n for t in trajs for c in t.calls for n in (c.node, *c.namespace) if n}
    unmatched = sorted(asked - ran)
    if unmatched:
        warnings.warn(
            f"train_nodes names {unmatched}, which matched no call of the trainable model in "
            f"any rollout of this step; the nodes that called it: {sorted(ran)}",
            UserWarning,
            stacklevel=3,
        )
    waiting = sum(t.interrupted for t in trajs)
    if waiting:
        warnings.warn(
            f"{waiting} of this step's {len(trajs)} trajectories still wait at an interrupt() "
            "(trajectory.interrupted): they train on the calls made before it. Resume them "
            "under capture(thread=..., store=...) first to train the whole run",
            UserWarning,
            stacklevel=3,
        )
    return {"train_nodes_unmatched": len(unmatched), "interrupted_trajectories": waiting}


def rewarded_node(call: LLMCall, nodes: Collection[str]) -> str | None:
    """The node whose reward trains `call`: its own node if `nodes` has it, else the
    innermost node of its namespace that `nodes` has (a subgraph's node); None if neither."""
    return next((n for n in reversed([*call.namespace, call.node]) if n in nodes), None)


def node_advantages(
    trajs: Sequence[Trajectory], scale_rewards: bool = True
) -> tuple[dict[str, float], bool]:
    """Per-node advantages of one group's calls: call id -> advantage, and whether any
    node's rewards differ within the group (a learning signal).

    For each node named in any trajectory's `node_rewards`, the trajectories with a
    trainable call of that node form the node's group; node rewards are
    `node_rewards.get(node, reward)`, and their advantages (as `compute_advantages`)
    go to each of those trajectories' calls of that node. A call is of node n when n is
    its `node`, or the innermost node of its `namespace` named (`rewarded_node`). Calls
    of nodes named nowhere are not in the result: they train on the trajectory's
    advantage, from `reward` over the whole group.
    """
    named = {n for t in trajs for n in t.node_rewards}
    if not named:
        return {}, False
    members: dict[str, list[tuple[int, list[str]]]] = {}
    for i, traj in enumerate(trajs):
        by_node: dict[str, list[str]] = {}
        for call in traj.calls:
            if call.trainable and (node := rewarded_node(call, named)) is not None:
                by_node.setdefault(node, []).append(call.id)
        for node, ids in by_node.items():
            members.setdefault(node, []).append((i, ids))
    per_call: dict[str, float] = {}
    signal = False
    for node, rows in sorted(members.items()):
        rewards = [trajs[i].node_rewards.get(node, trajs[i].reward) for i, _ in rows]
        signal = signal or not is_zero_variance(rewards)
        for (_, ids), adv in zip(rows, compute_advantages(rewards, scale_rewards), strict=True):
            per_call.update(dict.fromkeys(ids, adv))
    return per_call, signal


def repeated_call_ids(traj: Trajectory) -> list[str]:
    """Ids of `traj`'s calls whose tool calls all repeat tool calls of its earlier calls:
    the same function name and arguments (parsed, so key order and spacing do not count)."""
    seen: set[str] = set()
    out = []
    for call in traj.calls:
        keys = [_tool_call_key(c) for c in (call.response_message or {}).get("tool_calls") or []]
        if keys and all(k in seen for k in keys):
            out.append(call.id)
        seen.update(keys)
    return out


def _tool_call_key(call: Any) -> str:
    """One OpenAI tool call's identity (`tool_call_key`)."""
    fn = call.get("function", call) if isinstance(call, dict) else {}
    return tool_call_key(fn.get("name"), fn.get("arguments"))


def cap_repeated_calls(
    trajs: Sequence[Trajectory],
    advantages: Sequence[float],
    per_call: dict[str, float],
    counts: dict[str, int],
) -> dict[str, float]:
    """`per_call` with each repeated call (`repeated_call_ids`) of `trajs` at its advantage
    (its node's, else its trajectory's) where negative, else 0 (`repeated_calls=
    "at_most_zero"`); those raised to 0 from above are counted in
    `counts["repeated_calls_zeroed"]`."""
    out = dict(per_call)
    for traj, adv in zip(trajs, advantages, strict=True):
        for call_id in repeated_call_ids(traj):
            own = out.get(call_id, adv)
            counts["repeated_calls_zeroed"] += own > 0
            out[call_id] = min(own, 0.0)
    return out


def _stalest(trajs: list[Trajectory]) -> int:
    """The oldest adapter step any trainable call of these trajectories was sampled from."""
    steps = [
        c.adapter_step for t in trajs for c in t.calls if c.trainable and c.adapter_step is not None
    ]
    return min(steps) if steps else 10**9
