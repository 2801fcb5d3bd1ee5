"""Token-in/token-out tensorization: trajectories -> training sequences -> packed micro-batches.

A trajectory's trainable `LLMCall`s become sequences of the exact ids the engine saw
and sampled, never a re-rendered template. A call whose prompt extends the current
sequence (previous prompts + completions) token-exactly is merged into it: the new
prompt suffix (tool results, user turns) is masked out and the completion is trained.
Where the prefix breaks (a template that re-renders history differently, a forced
tool call re-serialized, a summarised context), a new sequence starts and shares the
trajectory's advantage. Calls recorded without token ids (another provider) are
re-rendered and tokenized only when `allow_retokenize` is set; otherwise the error
names the trajectory. Sequences over `max_seq_length` are cut and counted.

Packing puts several sequences in one row (first-fit decreasing) with a block-diagonal
causal mask and positions that restart per sequence, so rows carry little padding.

Prefix sharing (with packing): sequences whose untrainable heads are the same (a group's
prompt: system prompt, tool specs, task) become one bundle in one row: the head once,
then each sequence's rest, which attends to the head and to itself.
The head stops one token short of the common prefix, so each rest starts with the last
prompt token and "the state at t-1 predicts token t" holds inside every rest; logprobs
and gradients are those of the sequences alone (ART packs a group's prefix once too).

Left out: splitting one sequence across rows (a sequence longer than a row is cut);
sharing part of a head (two groups with one system prompt and different tasks).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from art_langgraph.errors import UsageError
from art_langgraph.training.segments import RowSegments, Segment
from art_langgraph.trajectory import LLMCall, Trajectory

__all__ = [
    "MicroBatch",
    "TensorizeStats",
    "TrainSequence",
    "build_sequences",
    "micro_batches",
    "pack_rows",
]

MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are not shared: the bundle's longer rows would cost more."""
MAX_BUNDLE_TOKENS = 4096
"""A bundle grows past the longest sequence up to this many tokens (attention is dense
over a row, so its cost grows with the row's length squared); more members start another."""


@dataclass
class TrainSequence:
    """One training sequence: ids, which of them were sampled, and the sampler's logprobs."""

    tokens: list[int]
    trainable: list[bool]
    """True where the token was sampled by the model (a completion token)."""
    sampler_logprobs: list[float]
    """The sampler's logprob of each token; NaN where unknown or not trainable."""
    advantage: float
    trajectory_id: str = ""
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_trainable(self) -> int:
        return sum(self.trainable)

    def extend(
        self, ids: Sequence[int], trainable: bool, logprobs: Sequence[float] | None = None
    ) -> None:
        self.tokens.extend(ids)
        self.trainable.extend([trainable] * len(ids))
        if logprobs is None:
            self.sampler_logprobs.extend([math.nan] * len(ids))
        else:
            self.sampler_logprobs.extend(float(x) for x in logprobs)


@dataclass
class TensorizeStats:
    """Counts of what tensorization did, reported in the step's metrics."""

    trajectories: int = 0
    calls: int = 0
    sequences: int = 0
    merged_calls: int = 0
    """Calls appended to the previous call's sequence (their prompt extended it token-exactly)."""
    prefix_breaks: int = 0
    """Calls that started a new sequence although the trajectory had one already."""
    truncated_sequences: int = 0
    retokenized_calls: int = 0
    untrainable_trajectories: int = 0
    """Trajectories left with no trainable token (skipped)."""

    def add(self, other: TensorizeStats) -> None:
        for k, v in vars(other).items():
            setattr(self, k, getattr(self, k) + v)


def _call_ids(
    call: LLMCall,
    traj: Trajectory,
    tokenizer: Any,
    allow_retokenize: bool,
    stats: TensorizeStats,
    vocab_size: int | None = None,
) -> tuple[list[int], list[int], list[float] | None]:
    if call.prompt_token_ids is not None and call.completion_token_ids is not None:
        prompt, completion = list(call.prompt_token_ids), list(call.completion_token_ids)
        where = f"trajectory {traj.id!r}, call {call.id}"
        if vocab_size is not None:
            bad = next((t for t in (*prompt, *completion) if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise UsageError(
                    f"{where}: token id {bad} is outside the model's vocabulary [0, {vocab_size}) "
                    "(recorded from another model?)"
                )
        if call.logprobs is not None and len(call.logprobs) != len(completion):
            raise UsageError(
                f"{where}: {len(call.logprobs)} logprobs for {len(completion)} completion tokens"
            )
        return prompt, completion, call.logprobs
    if not allow_retokenize:
        raise UsageError(
            f"trajectory {traj.id!r} has a trainable call ({call.id}) without token ids (recorded from "
            "another provider?); set TrainConfig(allow_retokenize=True) to re-render it with the chat "
            "template, or mark the call trainable=False"
        )
    if tokenizer is None:
        raise UsageError("retokenizing needs the model's tokenizer")
    from art_langgraph.engine.chat_format import normalize_messages
    from art_langgraph.engine.templates import ChatFormat

    fmt = ChatFormat.of(tokenizer)
    messages = normalize_messages(call.messages)
    prompt = fmt.prompt_ids(messages, call.tools)
    full_text = fmt.render(
        [*messages, *normalize_messages([call.response_message])],
        call.tools,
        add_generation_prompt=False,
    )
    full = list(tokenizer.encode(full_text, add_special_tokens=False))
    if full[: len(prompt)] != prompt:
        raise UsageError(
            f"trajectory {traj.id!r}: the chat template does not render call {call.id} as a prefix extension"
        )
    completion = full[len(prompt) :]
    eos = tokenizer.eos_token_id
    if eos in completion:
        completion = completion[: len(completion) - completion[::-1].index(eos)]
    stats.retokenized_calls += 1
    return prompt, completion, None


def build_sequences(
    traj: Trajectory,
    advantage: float,
    *,
    max_seq_length: int,
    tokenizer: Any = None,
    allow_retokenize: bool = False,
    vocab_size: int | None = None,
) -> tuple[list[TrainSequence], TensorizeStats]:
    """The training sequences of one trajectory (see the module doc). With `vocab_size`,
    a token id outside [0, vocab_size) is a UsageError naming the trajectory and call."""
    stats = TensorizeStats(trajectories=1)
    seqs: list[TrainSequence] = []
    current: TrainSequence | None = None
    for call in traj.calls:
        if not call.trainable:
            continue
        stats.calls += 1
        prompt, completion, lps = _call_ids(
            call, traj, tokenizer, allow_retokenize, stats, vocab_size
        )
        if current is not None and prompt[: len(current)] == current.tokens:
            current.extend(prompt[len(current) :], False)
            stats.merged_calls += 1
        else:
            if current is not None:
                seqs.append(current)
                stats.prefix_breaks += 1
            current = TrainSequence([], [], [], advantage, traj.id)
            current.extend(prompt, False)
        current.extend(completion, True, lps)
    if current is not None:
        seqs.append(current)
    out = []
    for s in seqs:
        if len(s) > max_seq_length:
            s.tokens, s.trainable = s.tokens[:max_seq_length], s.trainable[:max_seq_length]
            s.sampler_logprobs = s.sampler_logprobs[:max_seq_length]
            s.truncated = True
            stats.truncated_sequences += 1
        if s.num_trainable:
            out.append(s)
    if not out:
        stats.untrainable_trajectories += 1
    stats.sequences = len(out)
    return out, stats


def pack_rows(lengths: Sequence[int], row_length: int) -> list[list[int]]:
    """First-fit decreasing: indices of sequences grouped into rows of at most row_length tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        if n > row_length:
            raise UsageError(f"sequence {i} has {n} tokens, more than a row ({row_length})")
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(row_length - n)
    return rows


@dataclass
class MicroBatch:
    """Rows for one forward/backward pass. Targets are shifted: position t predicts token t."""

    input_ids: torch.Tensor  # (R, L)
    position_ids: torch.Tensor  # (R, L)
    attention_mask: (
        torch.Tensor
    )  # (R, 1, L, L) bool block-diagonal causal (packed) or (R, L) (padded)
    target_mask: torch.Tensor  # (R, L) bool: token t is trainable
    sampler_logprobs: torch.Tensor  # (R, L) float, NaN where unknown
    advantages: torch.Tensor  # (R, L) float
    seq_ids: (
        torch.Tensor
    )  # (R, L) long: 0..S-1 within this micro-batch, -1 on padding, -2 on a shared head
    num_sequences: int
    real_tokens: int
    stats: dict[str, float] = field(default_factory=dict)
    segments: tuple[RowSegments, ...] | None = None
    """Packed rows only: each row's blocks and what each sees (`training.segments`), the
    same attention as `attention_mask` at the cost of only the visible blocks."""


@dataclass(frozen=True)
class _Unit:
    """What packing places: one sequence (shared=0), or a bundle of sequences whose first
    `shared` tokens are equal and untrainable, written once."""

    members: tuple[int, ...]
    shared: int
    length: int


def _untrainable_head(s: TrainSequence) -> int:
    return next((i for i, t in enumerate(s.trainable) if t), len(s))


def prefix_units(seqs: Sequence[TrainSequence], cap: int) -> list[_Unit]:
    """Bundles of sequences with the same untrainable head (everything before their first
    trainable token: a group's prompt) of more than MIN_SHARED_PREFIX tokens, each bundle
    at most `cap` tokens; the other sequences alone. Only whole heads are shared: a
    shorter common part (a system prompt alone) saves little and lengthens rows, whose
    dense attention costs their length squared."""
    heads = [_untrainable_head(s) for s in seqs]
    buckets: dict[tuple[int, ...], list[int]] = {}
    units: list[_Unit] = []
    for i, s in enumerate(seqs):
        if heads[i] > MIN_SHARED_PREFIX:
            buckets.setdefault(tuple(s.tokens[: heads[i]]), []).append(i)
        else:
            units.append(_Unit((i,), 0, len(s)))
    for head, members in buckets.items():
        shared = len(head) - 1  # each rest starts with the head's last token (module doc)
        chunk: list[int] = []
        length = shared
        for i in members:
            rest = len(seqs[i]) - shared
            if chunk and length + rest > cap:
                units.append(_bundle(seqs, chunk, shared, length))
                chunk, length = [], shared
            chunk.append(i)
            length += rest
        units.append(_bundle(seqs, chunk, shared, length))
    return units


def _bundle(seqs: Sequence[TrainSequence], members: list[int], shared: int, length: int) -> _Unit:
    if len(members) == 1:
        return _Unit((members[0],), 0, len(seqs[members[0]]))
    return _Unit(tuple(members), shared, length)


def _collate(seqs: list[TrainSequence], rows: list[list[_Unit]], packed: bool) -> MicroBatch:
    length = max(sum(u.length for u in row) for row in rows)
    r = len(rows)
    ids = torch.zeros((r, length), dtype=torch.long)
    pos = torch.zeros((r, length), dtype=torch.long)
    target = torch.zeros((r, length), dtype=torch.bool)
    lps = torch.full((r, length), math.nan)
    adv = torch.zeros((r, length))
    sid = torch.full((r, length), -1, dtype=torch.long)
    # Attention blocks: a token sees earlier tokens of its own segment and of its owner
    # segment (a bundle's head); -1 on padding.
    seg = torch.full((r, length), -1, dtype=torch.long)
    owner = torch.full((r, length), -1, dtype=torch.long)
    k = g = shared_total = 0
    layout: list[RowSegments] = []
    for ri, row in enumerate(rows):
        at = 0
        blocks: list[Segment] = []
        for unit in row:
            head, start = g, unit.shared
            head_at = at
            if start:
                blocks.append(Segment(at, at + start))
                first = seqs[unit.members[0]]
                ids[ri, at : at + start] = torch.tensor(first.tokens[:start])
                pos[ri, at : at + start] = torch.arange(start)
                sid[ri, at : at + start] = -2
                seg[ri, at : at + start] = owner[ri, at : at + start] = head
                at, g = at + start, g + 1
                shared_total += start * (len(unit.members) - 1)
            for i in unit.members:
                s = seqs[i]
                n = len(s) - start
                ids[ri, at : at + n] = torch.tensor(s.tokens[start:])
                pos[ri, at : at + n] = torch.arange(start, start + n)
                target[ri, at : at + n] = torch.tensor(s.trainable[start:])
                target[ri, at] = False  # nothing in this segment predicts its first token
                lps[ri, at : at + n] = torch.tensor(s.sampler_logprobs[start:])
                adv[ri, at : at + n] = s.advantage
                sid[ri, at : at + n] = k
                seg[ri, at : at + n] = g
                owner[ri, at : at + n] = head if start else g
                blocks.append(
                    Segment(at, at + n, head_at, head_at + start) if start else Segment(at, at + n)
                )
                k, g, at = k + 1, g + 1, at + n
        layout.append(tuple(blocks))
    valid = seg >= 0  # (R, L)
    real = int(valid.sum())
    if packed:
        causal = torch.tril(torch.ones((length, length), dtype=torch.bool))
        same = (seg.unsqueeze(2) == seg.unsqueeze(1)) | (owner.unsqueeze(2) == seg.unsqueeze(1))
        mask = (causal & same & valid.unsqueeze(2)).unsqueeze(1)  # (R, 1, L, L)
        # Padding rows attend to themselves so no softmax row is empty.
        eye = torch.eye(length, dtype=torch.bool).expand(r, 1, length, length)
        mask = mask | (eye & ~valid.unsqueeze(2).unsqueeze(1))
    else:
        mask = valid.long()
    stats = {"padding_waste": 1 - real / (r * length), "shared_prefix_tokens": float(shared_total)}
    segments = tuple(layout) if packed else None
    return MicroBatch(ids, pos, mask, target, lps, adv, sid, k, real, stats, segments)


def micro_batches(
    seqs: list[TrainSequence],
    *,
    row_length: int,
    micro_batch_tokens: int,
    pack: bool,
    share_prefixes: bool = False,
) -> Iterator[MicroBatch]:
    """Rows of sequences (packed or one per row), grouped into micro-batches of
    ~micro_batch_tokens. With `share_prefixes` (packing only), sequences sharing a prompt
    prefix are bundled (module doc) and rows grow to the longest bundle."""
    if not seqs:
        return
    if pack and share_prefixes:
        cap = max(row_length, min(micro_batch_tokens, MAX_BUNDLE_TOKENS))
        units = prefix_units(seqs, cap)
    else:
        units = [_Unit((i,), 0, len(s)) for i, s in enumerate(seqs)]
    lengths = [u.length for u in units]
    if pack:
        widest = max([row_length, *(u.length for u in units if u.shared)])
        rows = pack_rows(lengths, widest)
    else:
        rows = [[i] for i in sorted(range(len(units)), key=lambda i: -lengths[i])]
    batch: list[list[_Unit]] = []
    width = 0
    for row in rows:
        n = sum(lengths[i] for i in row)
        wider = max(width, n)
        if batch and wider * (len(batch) + 1) > micro_batch_tokens:
            yield _collate(seqs, batch, pack)
            batch, wider = [], n
        batch.append([units[i] for i in row])
        width = wider
    if batch:
        yield _collate(seqs, batch, pack)
