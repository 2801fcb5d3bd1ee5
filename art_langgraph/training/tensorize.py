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

Prefix sharing (with packing): sequences whose untrainable heads (all before their first
sampled token) share a start form a prefix tree in one row: the part all of them share
once (an agent's system prompt and tool specs: ~650 tokens on the MCP harness), then
the part a subset shares (a group's task), then each sequence's rest, which attends to
the parts above it and to itself. Shared parts stop one token short of each member's
head, so each rest starts with its last prompt token and "the state at t-1 predicts
token t" holds inside every rest; logprobs and gradients are those of the sequences
alone. (ART packs a group's prompt once; a tree also shares one system prompt across
groups: on a step of 8 groups x 4 agent rollouts that is 7 fewer copies of it.)

Duplicates: identical sequences (a solved group's rollouts often sample the same thing)
are trained once, weighed by how many they stand for (`merge_duplicates`).

Left out: splitting one sequence across rows (a sequence longer than a row is cut).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from art_langgraph.engine.packed_linear import bucket_rows
from art_langgraph.errors import UsageError
from art_langgraph.training.segmented_attention import RowSegments, Segment, dense_mask
from art_langgraph.trajectories.trajectory import LLMCall, Trajectory

MIN_SHARED_PREFIX = 16
"""Prompts sharing fewer first tokens form no tree: the saving would not pay for the
extra attention blocks."""
MAX_BUNDLE_TOKENS = 8192
"""A prefix tree grows past the longest sequence up to this many tokens (or the
micro-batch's, if fewer); more members start another tree that repeats the parts they
need. Under segmented attention a longer tree costs little more per token; under the
dense mask (the reference path) its attention grows with its length squared."""


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
    token_advantages: list[float] | None = None
    """One advantage per token, where the sequence's calls have different ones (calls of
    nodes with their own rewards, `Trajectory.node_rewards`); None: `advantage` for all."""
    copies: int = 1
    """How many identical sequences this one stands for (`merge_duplicates`): the loss
    weighs its tokens by it, and the step's normalizers count it that many times."""

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_trainable(self) -> int:
        return sum(self.trainable)

    def extend(
        self,
        ids: Sequence[int],
        trainable: bool,
        logprobs: Sequence[float] | None = None,
        advantage: float | None = None,
    ) -> None:
        if advantage is not None and advantage != self.advantage and self.token_advantages is None:
            self.token_advantages = [self.advantage] * len(self.tokens)
        if self.token_advantages is not None:
            adv = self.advantage if advantage is None else advantage
            self.token_advantages.extend([adv] * len(ids))
        self.tokens.extend(ids)
        self.trainable.extend([trainable] * len(ids))
        if logprobs is None:
            self.sampler_logprobs.extend([math.nan] * len(ids))
        else:
            self.sampler_logprobs.extend(float(x) for x in logprobs)


def merge_duplicates(seqs: Sequence[TrainSequence]) -> tuple[list[TrainSequence], int]:
    """`seqs` with identical sequences (the same tokens, trained tokens and advantages: a
    group's rollouts that sampled the same thing, common once a question type is solved)
    merged into the first of them, its `copies` their sum; and how many were merged away.

    The loss is a sum over tokens of terms that depend on a token's trainer and sampler
    logprobs and its advantage, so k identical sequences give k times one sequence's terms:
    the trainer computes one and weighs it by k (the step's normalizers still count k), the
    same update for a kth of the compute. The sampler's logprobs are the first copy's (the
    copies' differ only by the engine's batch-dependent rounding)."""
    first: dict[tuple[Any, ...], TrainSequence] = {}
    out: list[TrainSequence] = []
    for s in seqs:
        adv = None if s.token_advantages is None else tuple(s.token_advantages)
        key = (tuple(s.tokens), tuple(s.trainable), s.advantage, adv, s.truncated)
        if (kept := first.get(key)) is None:
            kept = first[key] = replace(s)
            out.append(kept)
        else:
            kept.copies += s.copies
    return out, len(seqs) - len(out)


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
    from art_langgraph.chat.format import template_messages
    from art_langgraph.chat.templates import ChatFormat

    fmt = ChatFormat.of(tokenizer)
    messages = template_messages(call.messages)
    prompt = fmt.prompt_ids(messages, call.tools)
    full_text = fmt.render(
        [*messages, *template_messages([call.response_message])],
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
    call_advantages: Mapping[str, float] | None = None,
) -> tuple[list[TrainSequence], TensorizeStats]:
    """The training sequences of one trajectory (see the module doc). With `vocab_size`,
    a token id outside [0, vocab_size) is a UsageError naming the trajectory and call.
    `call_advantages` (call id -> advantage) gives some calls their own advantage (their
    node's); the others get `advantage`."""
    per_call = call_advantages or {}
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
        adv = per_call.get(call.id, advantage)
        if current is not None and prompt[: len(current)] == current.tokens:
            current.extend(prompt[len(current) :], False)
            stats.merged_calls += 1
        else:
            if current is not None:
                seqs.append(current)
                stats.prefix_breaks += 1
            current = TrainSequence([], [], [], adv, traj.id)
            current.extend(prompt, False)
        current.extend(completion, True, lps, adv)
    if current is not None:
        seqs.append(current)
    out = []
    for s in seqs:
        if len(s) > max_seq_length:
            s.tokens, s.trainable = s.tokens[:max_seq_length], s.trainable[:max_seq_length]
            s.sampler_logprobs = s.sampler_logprobs[:max_seq_length]
            if s.token_advantages is not None:
                s.token_advantages = s.token_advantages[:max_seq_length]
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
    weights: torch.Tensor  # (R, L) float: each sequence's `copies` on its own tokens, else 0
    seq_ids: (
        torch.Tensor
    )  # (R, L) long: 0..S-1 within this micro-batch, -1 on padding, -2 on a shared prompt part
    num_sequences: int
    real_tokens: int
    stats: dict[str, float] = field(default_factory=dict)
    segments: tuple[RowSegments, ...] | None = None
    """Packed rows only: each row's blocks and what each sees (`training.segments`), the
    same attention as `attention_mask` at the cost of only the visible blocks."""


@dataclass(frozen=True)
class _Node:
    """One block of a unit: tokens[start:end] of sequence `seq` (the same tokens in every
    sequence below it), under the node at index `parent` of the unit (-1: a root)."""

    seq: int
    start: int
    end: int
    parent: int
    leaf: bool
    """A sequence's own rest (trained); else a shared prompt part (never trained)."""


@dataclass(frozen=True)
class _Unit:
    """What packing places: one sequence alone, or a tree of sequences whose prompts share
    parts, each shared part written once (`nodes`, parents before children)."""

    members: tuple[int, ...]
    nodes: tuple[_Node, ...]
    length: int
    saved: int
    """Tokens not written because a shared part stands for them: sum of the members'
    lengths minus `length`."""


def _alone(seqs: Sequence[TrainSequence], i: int) -> _Unit:
    return _Unit((i,), (_Node(i, 0, len(seqs[i]), -1, True),), len(seqs[i]), 0)


def _untrainable_head(s: TrainSequence) -> int:
    return next((i for i, t in enumerate(s.trainable) if t), len(s))


@dataclass
class _Trie:
    """A prefix-tree node while building: tokens [start, end) shared by `members`."""

    start: int
    end: int
    members: list[int]
    children: list[_Trie] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    """Members whose own rest starts at `end`."""


def _grow(
    seqs: Sequence[TrainSequence], caps: dict[int, int], members: list[int], at: int
) -> _Trie:
    """The trie of `members`, which share tokens[:at]: their common run from `at` (within
    every member's cap), then one child per next token (a lone member: a leaf)."""
    first = seqs[members[0]].tokens
    end = at
    limit = min(caps[i] for i in members)
    while end < limit and all(seqs[i].tokens[end] == first[end] for i in members):
        end += 1
    node = _Trie(at, end, members)
    by_next: dict[int, list[int]] = {}
    for i in members:
        if caps[i] == end:
            node.leaves.append(i)
        else:
            by_next.setdefault(seqs[i].tokens[end], []).append(i)
    for part in by_next.values():
        if len(part) == 1:
            node.leaves.append(part[0])
        else:
            node.children.append(_grow(seqs, caps, part, end))
    return node


def _paths(node: _Trie, above: tuple[_Trie, ...] = ()) -> Iterator[tuple[int, tuple[_Trie, ...]]]:
    """(member, the trie nodes from the root down to where its rest starts), depth first."""
    path = (*above, node)
    for i in node.leaves:
        yield i, path
    for child in node.children:
        yield from _paths(child, path)


def _tree_unit(seqs: Sequence[TrainSequence], chunk: list[tuple[int, tuple[_Trie, ...]]]) -> _Unit:
    if len(chunk) == 1:
        return _alone(seqs, chunk[0][0])
    nodes: list[_Node] = []
    slot: dict[int, int] = {}  # id(trie node) -> index in `nodes`
    for i, path in chunk:
        parent = -1
        for t in path:
            if id(t) not in slot:
                slot[id(t)] = len(nodes)
                nodes.append(_Node(t.members[0], t.start, t.end, parent, False))
            parent = slot[id(t)]
        nodes.append(_Node(i, path[-1].end, len(seqs[i]), parent, True))
    length = sum(n.end - n.start for n in nodes)
    members = tuple(i for i, _ in chunk)
    return _Unit(members, tuple(nodes), length, sum(len(seqs[i]) for i in members) - length)


def prefix_units(seqs: Sequence[TrainSequence], cap: int) -> list[_Unit]:
    """Sequences whose untrainable heads (everything before their first trainable token)
    share a common start of more than MIN_SHARED_PREFIX tokens form a prefix tree: the
    part every one shares (a system prompt and tool specs) once, then the part each
    subset shares (a group's task), then each sequence's rest, which attends to the parts
    above it. Each tree unit is at most `cap` tokens (a larger tree is cut into units by
    its leaves, depth first, each with the parts its leaves need); other sequences alone.
    Each shared part stops one token short of every member's head (module doc)."""
    caps = {i: _untrainable_head(s) - 1 for i, s in enumerate(seqs)}
    roots: dict[tuple[int, ...], list[int]] = {}
    units: list[_Unit] = []
    for i, s in enumerate(seqs):
        if caps[i] >= MIN_SHARED_PREFIX:
            roots.setdefault(tuple(s.tokens[:MIN_SHARED_PREFIX]), []).append(i)
        else:
            units.append(_alone(seqs, i))
    for members in roots.values():
        if len(members) == 1:
            units.append(_alone(seqs, members[0]))
            continue
        chunk: list[tuple[int, tuple[_Trie, ...]]] = []
        seen: set[int] = set()
        length = 0
        for i, path in _paths(_grow(seqs, caps, members, 0)):
            new = sum(t.end - t.start for t in path if id(t) not in seen)
            rest = len(seqs[i]) - path[-1].end
            if chunk and length + new + rest > cap:
                units.append(_tree_unit(seqs, chunk))
                chunk, seen, length = [], set(), 0
                new = sum(t.end - t.start for t in path)
            chunk.append((i, path))
            seen.update(id(t) for t in path)
            length += new + rest
        units.append(_tree_unit(seqs, chunk))
    return units


def _collate(
    seqs: list[TrainSequence], rows: list[list[_Unit]], packed: bool, bucket: bool = False
) -> MicroBatch:
    length = max(sum(u.length for u in row) for row in rows)
    if bucket:  # padding columns, as a shorter row's: no target, attended by nothing
        length = bucket_rows(length)
    r = len(rows)
    ids = torch.zeros((r, length), dtype=torch.long)
    pos = torch.zeros((r, length), dtype=torch.long)
    target = torch.zeros((r, length), dtype=torch.bool)
    lps = torch.full((r, length), math.nan)
    adv = torch.zeros((r, length))
    weights = torch.zeros((r, length))
    sid = torch.full((r, length), -1, dtype=torch.long)
    k = saved = 0
    layout: list[RowSegments] = []
    for ri, row in enumerate(rows):
        at = 0
        blocks: list[Segment] = []
        for unit in row:
            placed: list[Segment] = []  # each node's block, by node index
            for node in unit.nodes:
                s, n = seqs[node.seq], node.end - node.start
                ids[ri, at : at + n] = torch.tensor(s.tokens[node.start : node.end])
                pos[ri, at : at + n] = torch.arange(node.start, node.end)
                sees = (
                    () if node.parent < 0 else (*placed[node.parent].sees, placed[node.parent].own)
                )
                block = Segment(at, at + n, sees)
                placed.append(block)
                blocks.append(block)
                if node.leaf:
                    target[ri, at : at + n] = torch.tensor(s.trainable[node.start :])
                    target[ri, at] = False  # nothing in this block predicts its first token
                    lps[ri, at : at + n] = torch.tensor(s.sampler_logprobs[node.start :])
                    adv[ri, at : at + n] = (
                        s.advantage
                        if s.token_advantages is None
                        else torch.tensor(s.token_advantages[node.start :])
                    )
                    weights[ri, at : at + n] = s.copies
                    sid[ri, at : at + n] = k
                    k += 1
                else:
                    sid[ri, at : at + n] = -2
                at += n
            saved += unit.saved
        layout.append(tuple(blocks))
    real = int((sid != -1).sum())
    mask = dense_mask(layout, length) if packed else (sid != -1).long()
    stats = {"padding_waste": 1 - real / (r * length), "shared_prefix_tokens": float(saved)}
    segments = tuple(layout) if packed else None
    return MicroBatch(ids, pos, mask, target, lps, adv, weights, sid, k, real, stats, segments)


def micro_batches(
    seqs: list[TrainSequence],
    *,
    row_length: int,
    micro_batch_tokens: int,
    pack: bool,
    share_prefixes: bool = False,
    alone_tokens: int | None = None,
    tree_tokens: int | None = None,
    bucket_width: bool = False,
) -> Iterator[MicroBatch]:
    """Rows of sequences (packed or one per row), grouped into micro-batches of
    ~micro_batch_tokens. With `share_prefixes` (packing only), sequences sharing a prompt
    prefix are bundled (module doc) and rows grow to the longest bundle. `alone_tokens`:
    a smaller cap for micro-batches with no prefix tree in them (a larger micro-batch
    shares nothing more, and costs the trainer its activations' memory); `tree_tokens`:
    the same for micro-batches with one, which still take at least one row (a tree is never
    split; rows share nothing with each other). None: micro_batch_tokens. `bucket_width`:
    each micro-batch's rows padded to one of few widths (`packed_linear.bucket_rows`, at
    most 1/8 more columns): oneDNN keeps a kernel, with its buffers, for every row count its
    bfloat16 matmuls meet, and a warm start's batches each have their own."""
    if not seqs:
        return
    if pack and share_prefixes:
        cap = max(row_length, min(micro_batch_tokens, MAX_BUNDLE_TOKENS))
        units = prefix_units(seqs, cap)
    else:
        units = [_alone(seqs, i) for i in range(len(seqs))]
    lengths = [u.length for u in units]
    if pack:
        widest = max([row_length, *(u.length for u in units if len(u.members) > 1)])
        rows = pack_rows(lengths, widest)
    else:
        rows = [[i] for i in sorted(range(len(units)), key=lambda i: -lengths[i])]
    batch: list[list[_Unit]] = []
    width = 0
    tree = False  # whether `batch` holds a prefix tree
    for row in rows:
        n = sum(lengths[i] for i in row)
        wider = max(width, n)
        with_tree = tree or any(len(units[i].members) > 1 for i in row)
        cap = micro_batch_tokens
        if alone_tokens is not None and not with_tree:
            cap = min(cap, alone_tokens)
        if tree_tokens is not None and with_tree:
            cap = min(cap, tree_tokens)
        if batch and wider * (len(batch) + 1) > cap:
            yield _collate(seqs, batch, pack, bucket_width)
            batch, wider = [], n
            with_tree = any(len(units[i].members) > 1 for i in row)
        batch.append([units[i] for i in row])
        width, tree = wider, with_tree
    if batch:
        yield _collate(seqs, batch, pack, bucket_width)
