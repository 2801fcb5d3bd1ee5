"""Supervised warm start: conversations or trajectories -> sequences with the assistant tokens trained.

A conversation (OpenAI-format messages, optionally `{"messages": [...], "tools": [...]}`)
is rendered with the chat template (tools in the generic format where the template
ignores them), and only what the assistant wrote (its content, tool calls and
end-of-turn token) is trained: `ChatFormat.training_ids` finds it from `{% generation %}`
markers, or from the rendered text for templates without them. A `Trajectory` is trained on the exact ids its calls
recorded, through the same tensorization as RL.

Left out: loss on the prompt.
"""

from __future__ import annotations

from typing import Any

from art_langgraph.chat.format import template_messages
from art_langgraph.chat.templates import ChatFormat
from art_langgraph.errors import UsageError
from art_langgraph.training.tensorize import TensorizeStats, TrainSequence, build_sequences
from art_langgraph.trajectories.trajectory import Trajectory


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
