"""Token-exact tensorization: hand-made trajectories -> sequences -> packed micro-batches.

Token ids are written out by hand so every expected sequence, mask and row can be read off
the test. The last tests run the real tiny model and check that a packed (or padded)
micro-batch gives every token the same logprob as its sequence run alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from art_langgraph.errors import UsageError
from art_langgraph.training.tensorize import (
    MIN_SHARED_PREFIX,
    MicroBatch,
    TensorizeStats,
    TrainSequence,
    build_sequences,
    merge_duplicates,
    micro_batches,
    pack_rows,
    prefix_units,
)
from art_langgraph.trajectories.trajectory import LLMCall, Trajectory

NAN = math.nan


def call(
    prompt: list[int] | None,
    completion: list[int] | None,
    logprobs: list[float] | None = None,
    **kw: Any,
) -> LLMCall:
    return LLMCall(
        prompt_token_ids=prompt, completion_token_ids=completion, logprobs=logprobs, **kw
    )


def traj(*calls: LLMCall, id: str = "traj-1") -> Trajectory:
    return Trajectory(id=id, calls=list(calls))


def same_floats(actual: list[float], expected: list[float]) -> bool:
    """Elementwise equality where NaN equals NaN."""
    return len(actual) == len(expected) and all(
        (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-6)
        for a, b in zip(actual, expected, strict=True)
    )


def seq(tokens: list[int], trainable: list[bool], advantage: float = 1.0) -> TrainSequence:
    lps = [-0.01 * (i + 1) if t else NAN for i, t in enumerate(trainable)]
    return TrainSequence(list(tokens), list(trainable), lps, advantage)


# --------------------------------------------------------------------------- build_sequences


def test_calls_extending_the_prefix_merge_into_one_sequence() -> None:
    c1 = call([1, 2, 3], [10, 11], [-0.1, -0.2])
    # Call 2's prompt = call 1's prompt + completion + two tool-result tokens.
    c2 = call([1, 2, 3, 10, 11, 20, 21], [12, 13, 14], [-0.3, -0.4, -0.5])
    seqs, stats = build_sequences(traj(c1, c2), 0.5, max_seq_length=100)

    assert len(seqs) == 1
    s = seqs[0]
    assert s.tokens == [1, 2, 3, 10, 11, 20, 21, 12, 13, 14]
    assert s.trainable == [False, False, False, True, True, False, False, True, True, True]
    assert same_floats(s.sampler_logprobs, [NAN, NAN, NAN, -0.1, -0.2, NAN, NAN, -0.3, -0.4, -0.5])
    assert s.advantage == 0.5
    assert s.trajectory_id == "traj-1"
    assert not s.truncated
    assert s.num_trainable == 5
    assert stats == TensorizeStats(trajectories=1, calls=2, sequences=1, merged_calls=1)


def test_missing_logprobs_are_nan_on_the_completion() -> None:
    seqs, _ = build_sequences(traj(call([1, 2], [3, 4])), 1.0, max_seq_length=100)
    assert seqs[0].trainable == [False, False, True, True]
    assert all(math.isnan(x) for x in seqs[0].sampler_logprobs)


@pytest.mark.parametrize(
    "prompt2",
    [
        [1, 2, 99, 10, 11, 20],  # history re-rendered differently
        [1, 2],  # summarised context: shorter than the sequence so far
    ],
)
def test_a_prefix_break_starts_a_new_sequence_with_the_same_advantage(prompt2: list[int]) -> None:
    c1 = call([1, 2, 3], [10, 11], [-0.1, -0.2])
    c2 = call(prompt2, [12, 13], [-0.3, -0.4])
    seqs, stats = build_sequences(traj(c1, c2), -1.5, max_seq_length=100)

    assert [s.tokens for s in seqs] == [[1, 2, 3, 10, 11], [*prompt2, 12, 13]]
    assert seqs[0].trainable == [False, False, False, True, True]
    assert seqs[1].trainable == [False] * len(prompt2) + [True, True]
    assert same_floats(seqs[1].sampler_logprobs, [NAN] * len(prompt2) + [-0.3, -0.4])
    assert [s.advantage for s in seqs] == [-1.5, -1.5]
    assert stats.prefix_breaks == 1
    assert stats.merged_calls == 0
    assert stats.sequences == 2


def test_untrainable_calls_are_skipped_and_their_tokens_masked() -> None:
    c0 = call([7, 8], [9], [-0.9], trainable=False)  # a judge call, say: not trained
    c1 = call([1, 2], [10, 11], [-0.1, -0.2])
    c2 = call([1, 2, 10, 11, 20], [30, 31], [-0.5, -0.6], trainable=False)
    # Call 3 extends the sequence through call 2's completion, which is now prompt.
    c3 = call([1, 2, 10, 11, 20, 30, 31, 21], [12], [-0.3])
    seqs, stats = build_sequences(traj(c0, c1, c2, c3), 1.0, max_seq_length=100)

    assert len(seqs) == 1
    assert seqs[0].tokens == [1, 2, 10, 11, 20, 30, 31, 21, 12]
    assert seqs[0].trainable == [False, False, True, True, False, False, False, False, True]
    assert stats.calls == 2
    assert stats.merged_calls == 1
    assert stats.untrainable_trajectories == 0


def test_untrainable_call_without_token_ids_does_not_raise() -> None:
    other = LLMCall(messages=[{"role": "user", "content": "x"}], trainable=False)
    seqs, stats = build_sequences(traj(other, call([1], [2])), 1.0, max_seq_length=100)
    assert [s.tokens for s in seqs] == [[1, 2]]
    assert stats.calls == 1


@pytest.mark.parametrize(
    "calls",
    [
        [call([1, 2], [3], trainable=False)],
        [call([1, 2], [])],  # trainable, but sampled nothing
        [],
    ],
    ids=["not-trainable", "empty-completion", "no-calls"],
)
def test_a_trajectory_without_trainable_tokens_yields_nothing(calls: list[LLMCall]) -> None:
    seqs, stats = build_sequences(traj(*calls), 1.0, max_seq_length=100)
    assert seqs == []
    assert stats.sequences == 0
    assert stats.untrainable_trajectories == 1
    assert stats.trajectories == 1


def test_truncation_keeps_the_head_and_is_counted() -> None:
    c = call([1, 2, 3, 4, 5, 6], [10, 11, 12, 13], [-0.1, -0.2, -0.3, -0.4])
    seqs, stats = build_sequences(traj(c), 1.0, max_seq_length=8)

    assert len(seqs) == 1
    s = seqs[0]
    assert s.tokens == [1, 2, 3, 4, 5, 6, 10, 11]
    assert s.trainable == [False] * 6 + [True, True]
    assert same_floats(s.sampler_logprobs, [NAN] * 6 + [-0.1, -0.2])
    assert s.truncated
    assert stats.truncated_sequences == 1
    assert stats.sequences == 1


def test_a_sequence_whose_trainable_tokens_are_all_cut_is_dropped() -> None:
    kept = call([1, 2], [3, 4])
    cut = call([50, 51, 52, 53, 54, 55, 56, 57], [60, 61])  # prefix break; completion past 8
    seqs, stats = build_sequences(traj(kept, cut), 1.0, max_seq_length=8)
    assert [s.tokens for s in seqs] == [[1, 2, 3, 4]]
    assert stats.truncated_sequences == 1
    assert stats.prefix_breaks == 1
    assert stats.sequences == 1
    assert stats.untrainable_trajectories == 0

    seqs, stats = build_sequences(traj(cut), 1.0, max_seq_length=8)
    assert seqs == []
    assert stats.untrainable_trajectories == 1


@pytest.mark.parametrize(
    "c",
    [
        LLMCall(messages=[{"role": "user", "content": "hi"}], response_message={"content": "yo"}),
        call([1, 2, 3], None),  # prompt ids but no completion ids
        call(None, [4, 5]),
    ],
    ids=["no-ids", "no-completion-ids", "no-prompt-ids"],
)
def test_a_call_without_token_ids_names_the_trajectory(c: LLMCall) -> None:
    with pytest.raises(UsageError, match="traj-without-ids") as info:
        build_sequences(traj(c, id="traj-without-ids"), 1.0, max_seq_length=100)
    assert "allow_retokenize" in str(info.value)


def test_retokenizing_needs_a_tokenizer() -> None:
    c = LLMCall(messages=[{"role": "user", "content": "hi"}], response_message={"content": "yo"})
    with pytest.raises(UsageError, match="tokenizer"):
        build_sequences(traj(c), 1.0, max_seq_length=100, allow_retokenize=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


def template_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_retokenize_renders_prompt_and_completion_with_the_template(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    c = LLMCall(messages=messages, response_message={"role": "assistant", "content": "hi you"})
    seqs, stats = build_sequences(
        traj(c), 2.0, max_seq_length=1000, tokenizer=tokenizer, allow_retokenize=True
    )

    assert len(seqs) == 1
    s = seqs[0]
    prompt = template_ids(tokenizer, messages)
    n = len(prompt)
    assert s.tokens[:n] == prompt
    completion = s.tokens[n:]
    assert tokenizer.decode(completion) == "hi you<|im_end|>"
    assert completion[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert s.trainable == [False] * n + [True] * len(completion)
    assert all(math.isnan(x) for x in s.sampler_logprobs)  # nothing recorded them
    assert stats.retokenized_calls == 1


def test_retokenized_turns_merge_like_recorded_ones(tokenizer: Any) -> None:
    turn1 = [{"role": "user", "content": "what is the time"}]
    reply1 = {"role": "assistant", "content": "let me check"}
    turn2 = [*turn1, reply1, {"role": "user", "content": "go on"}]
    reply2 = {"role": "assistant", "content": "it is noon"}
    t = traj(
        LLMCall(messages=turn1, response_message=reply1),
        LLMCall(messages=turn2, response_message=reply2),
    )
    seqs, stats = build_sequences(
        t, 1.0, max_seq_length=1000, tokenizer=tokenizer, allow_retokenize=True
    )

    assert len(seqs) == 1
    assert stats.merged_calls == 1 and stats.retokenized_calls == 2
    s = seqs[0]
    assert s.tokens[: len(template_ids(tokenizer, turn2))] == template_ids(tokenizer, turn2)
    trained = [tok for tok, m in zip(s.tokens, s.trainable, strict=True) if m]
    assert tokenizer.decode(trained) == "let me check<|im_end|>it is noon<|im_end|>"


# --------------------------------------------------------------------------- pack_rows


@pytest.mark.parametrize(
    ("lengths", "row", "expected"),
    [
        # Decreasing: 5 -> row0 (3 left); 4 -> row1 (4 left); 3 -> row0 (0 left);
        # 3 -> row1 (1 left); 2 fits nowhere -> row2.
        ([5, 4, 3, 3, 2], 8, [[0, 2], [1, 3], [4]]),
        # 6 -> row0 (2 left); 5 -> row1 (3 left); 3 -> row1; 2 goes back to row0 (first fit).
        ([2, 6, 3, 5], 8, [[1, 0], [3, 2]]),
        ([8, 8], 8, [[0], [1]]),
        ([], 8, []),
    ],
)
def test_pack_rows_first_fit_decreasing(
    lengths: list[int], row: int, expected: list[list[int]]
) -> None:
    assert pack_rows(lengths, row) == expected


def test_pack_rows_rejects_a_sequence_longer_than_a_row() -> None:
    with pytest.raises(UsageError, match=r"sequence 1 has 9 tokens.*\(8\)"):
        pack_rows([3, 9], 8)


# --------------------------------------------------------------------------- micro_batches

# Three sequences: A (3 tokens), B (2), C (4). Packed into rows of 8, first-fit decreasing
# gives row 0 = [C, A] (7 tokens) and row 1 = [B] (2 tokens, 5 padding).
A = seq([11, 12, 13], [False, True, True], advantage=1.0)
B = seq([21, 22], [False, True], advantage=-2.0)
C = seq([31, 32, 33, 34], [False, False, True, True], advantage=0.5)


def expected_mask(seq_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask written as loops; padding attends to itself only."""
    r, n = seq_ids.shape
    out = torch.zeros((r, 1, n, n), dtype=torch.bool)
    for b in range(r):
        for i in range(n):
            for j in range(n):
                si, sj = int(seq_ids[b, i]), int(seq_ids[b, j])
                out[b, 0, i, j] = (si >= 0 and si == sj and j <= i) or (si < 0 and i == j)
    return out


def only(batches: list[MicroBatch]) -> MicroBatch:
    assert len(batches) == 1
    return batches[0]


def test_packed_micro_batch_layout() -> None:
    mb = only(list(micro_batches([A, B, C], row_length=8, micro_batch_tokens=1000, pack=True)))

    assert mb.input_ids.tolist() == [[31, 32, 33, 34, 11, 12, 13], [21, 22, 0, 0, 0, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2], [0, 1, 0, 0, 0, 0, 0]]
    assert mb.seq_ids.tolist() == [[0, 0, 0, 0, 1, 1, 1], [2, 2, -1, -1, -1, -1, -1]]
    f, t = False, True
    assert mb.target_mask.tolist() == [[f, f, t, t, f, t, t], [f, t, f, f, f, f, f]]
    assert mb.advantages.tolist() == [[0.5] * 4 + [1.0] * 3, [-2.0, -2.0] + [0.0] * 5]
    assert same_floats(mb.sampler_logprobs[0].tolist(), [NAN, NAN, -0.03, -0.04, NAN, -0.02, -0.03])
    assert same_floats(mb.sampler_logprobs[1].tolist(), [NAN, -0.02] + [NAN] * 5)
    assert mb.num_sequences == 3
    assert mb.real_tokens == 9
    assert mb.stats["padding_waste"] == pytest.approx(1 - 9 / 14)

    assert mb.attention_mask.shape == (2, 1, 7, 7)
    assert mb.attention_mask.dtype == torch.bool
    assert torch.equal(mb.attention_mask, expected_mask(mb.seq_ids))
    m = mb.attention_mask[0, 0]
    assert not m[4, :4].any()  # A's first token sees nothing of C
    assert m[6, 4:7].all() and not m[6, :4].any()
    assert m[3, :4].all() and not m[3, 4:].any()
    assert mb.attention_mask.any(-1).all()  # no softmax row is empty


def test_padded_micro_batch_layout() -> None:
    mb = only(list(micro_batches([A, B, C], row_length=8, micro_batch_tokens=1000, pack=False)))

    # One sequence per row, longest first.
    assert mb.input_ids.tolist() == [[31, 32, 33, 34], [11, 12, 13, 0], [21, 22, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 0]]
    assert mb.seq_ids.tolist() == [[0, 0, 0, 0], [1, 1, 1, -1], [2, 2, -1, -1]]
    assert mb.advantages[:, 0].tolist() == [0.5, 1.0, -2.0]
    assert mb.target_mask.sum().item() == 5
    assert mb.num_sequences == 3
    assert mb.stats["padding_waste"] == pytest.approx(1 - 9 / 12)


@pytest.mark.parametrize(
    ("pack", "budget", "sizes"),
    [
        # Padded rows of widths 4, 3, 2: [C, A] is 2 x 4 = 8 tokens, B would make 12.
        (False, 8, [2, 1]),
        (False, 4, [1, 1, 1]),
        (False, 1000, [3]),
        # Packed rows (7 and 2 tokens): two rows would be 2 x 7 = 14 > 8.
        (True, 8, [2, 1]),
        (True, 14, [3]),
    ],
)
def test_micro_batch_tokens_splits_rows(pack: bool, budget: int, sizes: list[int]) -> None:
    batches = list(micro_batches([A, B, C], row_length=8, micro_batch_tokens=budget, pack=pack))
    assert [mb.num_sequences for mb in batches] == sizes
    seen = []
    for mb in batches:
        assert mb.seq_ids.max().item() == mb.num_sequences - 1  # ids restart per micro-batch
        for k in range(mb.num_sequences):
            where = mb.seq_ids == k
            seen.append(mb.input_ids[where].tolist())
    assert sorted(seen) == sorted([A.tokens, B.tokens, C.tokens])


def test_micro_batches_of_nothing() -> None:
    assert list(micro_batches([], row_length=8, micro_batch_tokens=8, pack=True)) == []


def test_the_first_token_of_a_sequence_is_never_a_target() -> None:
    # A call recorded with an empty prompt makes a sequence that starts with a completion token.
    starts_sampled, _ = build_sequences(traj(call([], [5, 6, 7])), 1.0, max_seq_length=100)
    seqs = [A, *starts_sampled]
    for pack in (True, False):
        mb = only(list(micro_batches(seqs, row_length=8, micro_batch_tokens=1000, pack=pack)))
        first = torch.zeros_like(mb.target_mask)
        first[:, 0] = True
        first[:, 1:] = mb.seq_ids[:, 1:] != mb.seq_ids[:, :-1]
        assert not (mb.target_mask & first).any()


# --------------------------------------------------------------------------- vs the real model


@pytest.fixture(scope="module")
def tiny_model(tiny_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


def token_logprobs(model: Any, ids: torch.Tensor, **kw: torch.Tensor) -> torch.Tensor:
    """log p(token t | tokens < t) for t >= 1, (R, L - 1)."""
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False, **kw).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def random_sequences(lengths: list[int], seed: int = 0) -> list[TrainSequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(3, 2000, (n,), generator=g).tolist()
        out.append(seq(ids, [i >= n // 2 for i in range(n)]))
    return out


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_micro_batch_logprobs_equal_each_sequence_alone(tiny_model: Any, pack: bool) -> None:
    seqs = random_sequences([7, 5, 11, 3, 9, 2, 14])
    batches = list(micro_batches(seqs, row_length=16, micro_batch_tokens=10_000, pack=pack))
    mb = only(batches)
    if pack:
        assert mb.input_ids.shape[0] < len(seqs)  # several sequences share a row
    got = token_logprobs(
        tiny_model, mb.input_ids, position_ids=mb.position_ids, attention_mask=mb.attention_mask
    )  # (R, L - 1): column t scores token t + 1

    checked = 0
    for k in range(mb.num_sequences):
        rows, cols = (mb.seq_ids == k).nonzero(as_tuple=True)
        row = int(rows[0])
        ids = mb.input_ids[row, cols].unsqueeze(0)
        alone = token_logprobs(tiny_model, ids)[0]  # (n - 1,)
        # Token cols[1:] is scored at column cols[1:] - 1 of the batch.
        packed = got[row, cols[1:] - 1]
        torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)
        checked += len(alone)
    assert checked == sum(len(s) - 1 for s in seqs)


# --------------------------------------------------------------------------- prefix sharing


def group_sequences(seed: int = 0, system: int = 0) -> list[TrainSequence]:
    """Two groups of sequences with a common prompt each (one member with its own extra
    prompt tokens, one with a multi-turn tail), plus an unrelated one. With `system`, both
    groups' prompts start with the same `system` tokens (an agent's system prompt)."""
    g = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, 2000, (n,), generator=g).tolist()

    head = rand(system)
    out = []
    for first, prompt_len, members in ((1, 24, 4), (2, MIN_SHARED_PREFIX + 3, 3)):
        # Each group's own part starts with its own token: the groups part there.
        prompt = [*head, first, *rand(prompt_len - 1)]
        prompt_len += system
        for m in range(members):
            extra = rand(3) if m == 1 else []
            done = rand(4 + m)
            tokens = prompt + extra + done
            trainable = [False] * (prompt_len + len(extra)) + [True] * len(done)
            if m == 2:  # a second turn: a tool result (masked), then another completion
                tokens += rand(3) + rand(2)
                trainable += [False] * 3 + [True] * 2
            out.append(seq(tokens, trainable, advantage=float(m) - 1.5))
    out.append(seq(rand(9), [False] * 5 + [True] * 4))
    return out


def _trees(units: list[Any]) -> list[Any]:
    return sorted((u for u in units if len(u.members) > 1), key=lambda u: u.members)


def test_prefix_units_share_each_groups_prompt() -> None:
    seqs = group_sequences()
    units = prefix_units(seqs, cap=1000)
    trees = _trees(units)
    assert [sorted(u.members) for u in trees] == [[0, 1, 2, 3], [4, 5, 6]]
    # One shared part per group, one token short of the shortest head (each rest starts
    # with its last prompt token); members 1 and 5 have extra prompt tokens in their rest.
    assert [[(n.start, n.end) for n in u.nodes if not n.leaf] for u in trees] == [
        [(0, 23)],
        [(0, MIN_SHARED_PREFIX + 2)],
    ]
    assert [u.saved for u in trees] == [3 * 23, 2 * (MIN_SHARED_PREFIX + 2)]
    for u in trees:
        assert u.length == sum(len(seqs[i]) for i in u.members) - u.saved
        for n in u.nodes:  # a shared part and the token after it are never trained
            if not n.leaf:
                assert not any(seqs[n.seq].trainable[: n.end + 1])
    assert sorted(i for u in units for i in u.members) == list(range(len(seqs)))


def test_prefix_units_share_a_system_prompt_across_groups() -> None:
    seqs = group_sequences(system=20)
    (tree,) = _trees(prefix_units(seqs, cap=1000))
    assert sorted(tree.members) == list(range(7))
    shared = [(n.start, n.end, n.parent) for n in tree.nodes if not n.leaf]
    # The system prompt once, then each group's task under it.
    assert shared == [(0, 20, -1), (20, 43, 0), (20, 20 + MIN_SHARED_PREFIX + 2, 0)]
    assert tree.saved == 6 * 20 + 3 * 23 + 2 * (MIN_SHARED_PREFIX + 2)
    for n in tree.nodes:  # every shared part is the same tokens in each member below it
        below = [i for i in tree.members if seqs[i].tokens[: n.end] == seqs[n.seq].tokens[: n.end]]
        assert n.leaf or len(below) > 1


def test_prefix_units_respect_the_cap_and_the_minimum() -> None:
    seqs = group_sequences(system=20)
    units = prefix_units(seqs, cap=80)
    for u in units:
        assert u.length <= 80 or len(u.members) == 1
        # A cut tree repeats the parts its members need: parents come before children,
        # and each leaf's chain of parents ends at the root (position 0).
        for j, n in enumerate(u.nodes):
            assert n.parent < j
            if n.leaf and len(u.members) > 1:
                p = n.parent
                while u.nodes[p].parent >= 0:
                    p = u.nodes[p].parent
                assert u.nodes[p].start == 0
    assert sorted(i for u in units for i in u.members) == list(range(len(seqs)))
    assert len(_trees(units)) > 1
    # A common prompt one token too short to share (the head would hold MIN - 1 tokens).
    short = [
        seq([*s.tokens[:MIN_SHARED_PREFIX], 7, 8], [False] * MIN_SHARED_PREFIX + [True] * 2)
        for s in group_sequences()[:3]
    ]
    assert all(len(u.members) == 1 for u in prefix_units(short, cap=1000))


@pytest.mark.parametrize("system", [0, 20])
def test_shared_prefix_rows_score_each_sequence_as_alone(tiny_model: Any, system: int) -> None:
    seqs = group_sequences(system=system)
    kw = dict(row_length=max(len(s) for s in seqs), micro_batch_tokens=10_000, pack=True)
    mb = only(list(micro_batches(seqs, share_prefixes=True, **kw)))
    plain = only(list(micro_batches(seqs, share_prefixes=False, **kw)))
    saved = 3 * 23 + 2 * (MIN_SHARED_PREFIX + 2) + 6 * system
    assert mb.stats["shared_prefix_tokens"] == saved
    assert mb.real_tokens == plain.real_tokens - saved
    assert int(mb.target_mask.sum()) == sum(s.num_trainable for s in seqs)
    got = token_logprobs(
        tiny_model, mb.input_ids, position_ids=mb.position_ids, attention_mask=mb.attention_mask
    )  # (R, L - 1): column t scores token t + 1
    for k in range(mb.num_sequences):
        rows, cols = (mb.target_mask & (mb.seq_ids == k)).nonzero(as_tuple=True)
        bundled = got[rows, cols - 1]
        # Which input sequence is k: the one whose trainable tokens these are.
        ids = mb.input_ids[rows, cols].tolist()
        (s,) = [
            s for s in seqs if [t for t, m in zip(s.tokens, s.trainable, strict=False) if m] == ids
        ]
        alone_all = token_logprobs(tiny_model, torch.tensor([s.tokens]))[0]  # (n - 1,)
        alone = alone_all[torch.tensor(s.trainable[1:])]
        torch.testing.assert_close(bundled, alone, atol=1e-5, rtol=0)
        # The rest of the sequence carries its own advantage and sampler logprobs.
        assert torch.all(mb.advantages[rows, cols] == s.advantage)
        expected = [x for x, m in zip(s.sampler_logprobs, s.trainable, strict=False) if m]
        assert mb.sampler_logprobs[rows, cols].tolist() == pytest.approx(expected)


def test_bucketed_widths_pad_columns_and_score_every_sequence_as_before(tiny_model: Any) -> None:
    from art_langgraph.engine.packed_linear import bucket_rows

    seqs = group_sequences(system=20)
    kw = dict(row_length=max(len(s) for s in seqs), micro_batch_tokens=10_000, pack=True)
    plain = only(list(micro_batches(seqs, share_prefixes=True, **kw)))
    mb = only(list(micro_batches(seqs, share_prefixes=True, bucket_width=True, **kw)))
    width = plain.input_ids.shape[1]
    assert mb.input_ids.shape[1] == bucket_rows(width) > width  # a width oneDNN has met
    assert mb.real_tokens == plain.real_tokens and mb.num_sequences == plain.num_sequences
    # the columns added are padding: no token, no target, in no sequence, in no block
    assert torch.equal(mb.input_ids[:, :width], plain.input_ids)
    assert torch.equal(mb.target_mask[:, :width], plain.target_mask)
    assert not mb.target_mask[:, width:].any() and bool((mb.seq_ids[:, width:] == -1).all())
    assert mb.segments == plain.segments
    assert mb.attention_mask.any(-1).all()  # no softmax row is empty
    kwargs = {"position_ids": mb.position_ids, "attention_mask": mb.attention_mask}
    got = token_logprobs(tiny_model, mb.input_ids, **kwargs)[:, : width - 1]
    kwargs = {"position_ids": plain.position_ids, "attention_mask": plain.attention_mask}
    want = token_logprobs(tiny_model, plain.input_ids, **kwargs)
    at = plain.target_mask[:, 1:]
    torch.testing.assert_close(got[at], want[at], atol=1e-5, rtol=0)


def test_prefix_sharing_needs_packing() -> None:
    seqs = group_sequences()
    mb = only(
        list(
            micro_batches(
                seqs, row_length=64, micro_batch_tokens=10_000, pack=False, share_prefixes=True
            )
        )
    )
    assert mb.stats["shared_prefix_tokens"] == 0
    assert mb.input_ids.shape[0] == len(seqs)


def test_tree_tokens_caps_micro_batches_with_a_tree_but_never_splits_a_row() -> None:
    seqs = group_sequences()  # two trees (one a group) and a sequence alone
    kw = dict(row_length=max(len(s) for s in seqs), micro_batch_tokens=10_000, pack=True)
    (whole,) = micro_batches(seqs, share_prefixes=True, **kw)
    assert whole.input_ids.shape[0] > 1  # several rows in one pass without the cap
    capped = list(micro_batches(seqs, share_prefixes=True, tree_tokens=1, **kw))
    assert len(capped) == whole.input_ids.shape[0]
    assert all(mb.input_ids.shape[0] == 1 for mb in capped)  # one row each, none cut
    # The same sequences, targets and shared tokens, only in more passes.
    assert sum(mb.num_sequences for mb in capped) == whole.num_sequences
    assert sum(int(mb.target_mask.sum()) for mb in capped) == int(whole.target_mask.sum())
    shared = sum(mb.stats["shared_prefix_tokens"] for mb in capped)
    assert shared == whole.stats["shared_prefix_tokens"]


# --------------------------------------------------------------------------- duplicates


def test_identical_sequences_merge_into_the_first_with_their_count() -> None:
    a, b = seq([5, 6, 7], [False, True, True]), seq([5, 6, 8], [False, True, True])
    other_adv = seq([5, 6, 7], [False, True, True], advantage=-1.0)
    per_token = seq([5, 6, 7], [False, True, True])
    per_token.token_advantages = [1.0, 1.0, 0.5]
    merged, n = merge_duplicates([a, b, seq([5, 6, 7], [False, True, True]), other_adv, per_token])
    assert n == 1 and [s.copies for s in merged] == [2, 1, 1, 1]
    assert merged[0].tokens == a.tokens and a.copies == 1  # the input is left as it was
    again, n = merge_duplicates([merged[0], seq([5, 6, 7], [False, True, True])])
    assert n == 1 and again[0].copies == 3


def test_a_micro_batch_weighs_each_sequences_tokens_by_its_copies() -> None:
    a, b = seq([5, 6, 7, 8], [False, False, True, True]), seq([9, 6, 7], [False, True, True])
    a.copies = 3
    (mb,) = micro_batches([a, b], row_length=16, micro_batch_tokens=64, pack=True)
    assert sorted(mb.weights[mb.target_mask].tolist()) == [1.0, 1.0, 3.0, 3.0]
