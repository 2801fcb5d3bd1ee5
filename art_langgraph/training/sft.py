"""Supervised warm start: conversations or trajectories -> sequences with the assistant tokens trained.

A conversation (OpenAI-format messages, optionally `{"messages": [...], "tools": [...]}`)
is rendered with the chat template (tools in the generic format where the template
ignores them), and only what the assistant wrote (its content, tool calls and
end-of-turn token) is trained: `ChatFormat.training_ids` finds it from `{% generation %}`
markers, or from the rendered text for templates without them. A `Trajectory` is trained on the exact ids its calls
recorded, through the same tensorization as RL.

`train_sft`'s `stop_loss` ends the warm start early: after an epoch from the second on
(`FIRST_STOP_EPOCH`) whose last quarter of batches (`tail_loss`) had a mean token loss at
or under it. Each of the first epoch's losses is measured before its batch is trained on,
so that epoch's tail is the loss on demonstrations the model has not yet been trained on;
later epochs' tails are on seen ones. Each step also counts the demonstrations with no
token in doubt (`sure_sequences`: every trained token's probability over one half), and
the metrics give each epoch's tail share of them: a mean loss of 0.00 can hide the one
token that decides.

Left out: loss on the prompt; a held-out slice of demonstrations.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from art_langgraph.chat.format import template_messages
from art_langgraph.chat.templates import ChatFormat
from art_langgraph.errors import UsageError
from art_langgraph.training.tensorize import TensorizeStats, TrainSequence, build_sequences
from art_langgraph.trajectories.trajectory import Trajectory

if TYPE_CHECKING:
    import torch

    from art_langgraph.training.base import Trainer
    from art_langgraph.training.config import TrainConfig


def _conversation(tokenizer: Any, item: Any, index: int, max_seq_length: int) -> TrainSequence:
    if isinstance(item, dict):
        messages, tools = item.get("messages"), item.get("tools")
    else:
        messages, tools = item, None
    if not isinstance(messages, list) or not messages:
        raise UsageError(f"SFT item {index} is not a conversation (a list of messages)")
    ids, mask = ChatFormat.of(tokenizer).training_ids(template_messages(messages), tools)
    if not any(mask):
        raise UsageError(
            f"SFT item {index} has no assistant tokens to train (no assistant turn, or a chat template "
            "without {% generation %} markers)"
        )
    seq = TrainSequence(
        ids[:max_seq_length],
        mask[:max_seq_length],
        [float("nan")] * min(len(ids), max_seq_length),
        1.0,
    )
    seq.truncated = len(ids) > max_seq_length
    if not seq.num_trainable:
        raise UsageError(
            f"SFT item {index} keeps no assistant token within max_seq_length={max_seq_length} "
            f"(it has {len(ids)} tokens): raise max_seq_length or shorten the conversation"
        )
    return seq


SURE_LOGPROB = math.log(0.5)
"""A token whose probability is above one half is the argmax: a demonstration whose every
trained token is above it would be reproduced by greedy decoding, teacher-forced."""


def sure_sequences(logprobs: torch.Tensor, seq_ids: torch.Tensor) -> float:
    """How many of the sequences in `seq_ids` (N,) have every trained token's logprob
    (`logprobs`, (N,)) above `SURE_LOGPROB`. A mean loss near zero can hide the one token
    that decides (which tool, which field); this counts the demonstrations where none is
    in doubt."""
    import torch

    if not seq_ids.numel():
        return 0.0
    ids, index = torch.unique(seq_ids, return_inverse=True)
    low = torch.zeros(len(ids), dtype=logprobs.dtype, device=logprobs.device)
    low = low.scatter_reduce(0, index, logprobs, "amin")  # each sequence's least likely token
    return float((low > SURE_LOGPROB).sum())


FIRST_STOP_EPOCH = 2
"""The first epoch after which `stop_loss` may end a warm start. The first epoch's tail
is on demonstrations not yet trained on, but on the capitals task it fell to 0.004-0.005,
under the stop loss, with held-out sampled success still at 0.58-0.67 (three paired runs
on its 128 demonstrations in float32, one bfloat16 arm on the validation slice's 96),
where a second epoch took the slice to 0.94-1.00 in every arm (bench/results/warm_stop,
docs/benchmarks.md#warm-stop-seeds)."""


def tail_loss(losses: list[float]) -> float:
    """The mean of an epoch's last quarter of batch losses (at least its last batch)."""
    tail = losses[-max(1, len(losses) // 4) :]
    return sum(tail) / len(tail)


def tail_share(counts: list[tuple[float, int]]) -> float:
    """The share of sure sequences (`sure_sequences`) over an epoch's last quarter of
    batches, given each batch's (sure, sequences)."""
    tail = counts[-max(1, len(counts) // 4) :]
    return sum(c for c, _ in tail) / max(1, sum(n for _, n in tail))


def sft_metrics(
    per_epoch: list[list[float]],
    seconds: float,
    sure: list[list[tuple[float, int]]] | None = None,
) -> dict[str, float]:
    """A warm start's metrics from each epoch's batch losses: the first and last batch's,
    each epoch's mean and tail (`sft_epoch<k>_loss`, `sft_epoch<k>_tail_loss`, k from 1),
    the epochs and optimizer steps it ran, and its seconds; with `sure` (each epoch's
    batches' sure sequences and sequences), each epoch's tail share of sure ones
    (`sft_epoch<k>_tail_sure`)."""
    flat = [x for epoch in per_epoch for x in epoch]
    out = {
        "sft_loss_first": flat[0],
        "sft_loss_last": flat[-1],
        "sft_steps": float(len(flat)),
        "sft_epochs": float(len(per_epoch)),
        "sft_seconds": seconds,
    }
    for k, losses in enumerate(per_epoch, 1):
        out[f"sft_epoch{k}_loss"] = sum(losses) / len(losses)
        out[f"sft_epoch{k}_tail_loss"] = tail_loss(losses)
    for k, counts in enumerate(sure or [], 1):
        out[f"sft_epoch{k}_tail_sure"] = tail_share(counts)
    return out


def run_sft(
    trainer: Trainer,
    seqs: list[TrainSequence],
    config: TrainConfig,
    epochs: int,
    batch_size: int,
    stop_loss: float | None,
) -> dict[str, float]:
    """Up to `epochs` passes of SFT steps over `seqs` in batches of `batch_size`, ending
    after an epoch whose `tail_loss` is at or under `stop_loss`; `sft_metrics`."""
    t0 = time.perf_counter()
    per_epoch: list[list[float]] = []
    sure: list[list[tuple[float, int]]] = []
    while len(per_epoch) < epochs:
        per_epoch.append([])
        sure.append([])
        for i in range(0, len(seqs), batch_size):
            m = trainer.sft_step(seqs[i : i + batch_size], config)
            per_epoch[-1].append(m["loss"])
            sure[-1].append((m.get("sure_sequences", 0.0), len(seqs[i : i + batch_size])))
        if (
            stop_loss is not None
            and len(per_epoch) >= FIRST_STOP_EPOCH
            and tail_loss(per_epoch[-1]) <= stop_loss
        ):
            break
    return sft_metrics(per_epoch, time.perf_counter() - t0, sure)


def sft_sequences(
    tokenizer: Any, items: list[Any], max_seq_length: int
) -> tuple[list[TrainSequence], TensorizeStats]:
    """Training sequences for SFT from trajectories and/or conversations."""
    seqs: list[TrainSequence] = []
    stats = TensorizeStats()
    for i, item in enumerate(items):
        if isinstance(item, Trajectory):
            s, st = build_sequences(
                item, 1.0, max_seq_length=max_seq_length, tokenizer=tokenizer, allow_retokenize=True
            )
            seqs += s
            stats.add(st)
        else:
            seq = _conversation(tokenizer, item, i, max_seq_length)
            stats.truncated_sequences += seq.truncated
            stats.sequences += 1
            seqs.append(seq)
    return seqs, stats
