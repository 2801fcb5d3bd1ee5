"""The LoRA trainer on the tiny model (CPU): RL and SFT steps, state on disk, loss variants.

Sequences are random token ids with the last few tokens trainable. Their sampler logprobs
are set to the trainer's own current logprobs, so the importance ratio is exactly 1 and the
expected loss of each variant can be written down from the advantages (and logprobs).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from art_langgraph.training import tensorize
from art_langgraph.training.config import TrainConfig
from art_langgraph.training.tensorize import TrainSequence, merge_duplicates
from art_langgraph.training.trainer import LoRATrainer
from tests.conftest import FP32_TRAINER

LR = 1e-3  # what tiny models take
TAIL = 5  # trainable tokens at the end of each sequence
OPTIMIZER_FILES = {"optimizer.safetensors", "optimizer.json"}
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors"}


@pytest.fixture
def make_trainer(tiny_path: Path) -> Callable[[], LoRATrainer]:
    def make() -> LoRATrainer:
        return LoRATrainer(str(tiny_path), FP32_TRAINER, device="cpu")

    return make


@pytest.fixture
def trainer(make_trainer: Callable[[], LoRATrainer]) -> LoRATrainer:
    return make_trainer()


def logprobs(trainer: LoRATrainer, tokens: list[int]) -> list[float]:
    """log p(token t | tokens < t) under the trainer's current weights; NaN for t = 0."""
    ids = torch.tensor([tokens], device=trainer.device)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
    return [math.nan, *lp.tolist()]


def completion_logprob(trainer: LoRATrainer, s: TrainSequence) -> float:
    """Sum of the logprobs of the trainable tokens of `s`."""
    lp = logprobs(trainer, s.tokens)
    return sum(x for x, m in zip(lp, s.trainable, strict=True) if m)


def make_sequences(
    trainer: LoRATrainer,
    lengths: list[int],
    advantages: list[float],
    seed: int = 0,
    tail: int = TAIL,
    offset: float = 0.0,
) -> list[TrainSequence]:
    """Random sequences whose sampler logprobs are the trainer's own (+ offset) on the tail."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, adv in zip(lengths, advantages, strict=True):
        tokens = torch.randint(3, 2000, (n,), generator=g).tolist()
        trainable = [i >= n - tail for i in range(n)]
        lp = logprobs(trainer, tokens)
        sampler = [x + offset if m else math.nan for x, m in zip(lp, trainable, strict=True)]
        out.append(TrainSequence(tokens, trainable, sampler, adv))
    return out


def lora_state(trainer: LoRATrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}


def restore(trainer: LoRATrainer, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if n in state:
                p.copy_(state[n])


def assert_finite(metrics: dict[str, float]) -> None:
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad


def rl_step_counting_micro_batches(
    trainer: LoRATrainer, seqs: list[TrainSequence], config: TrainConfig
) -> dict[str, float]:
    stages: list[str] = []
    m = trainer.rl_step(seqs, config, lambda stage, info: stages.append(stage))
    return {**m, "micro_batches": float(stages.count("micro_batch"))}


# --------------------------------------------------------------------------- rl_step


def test_rl_step_moves_logprobs_with_the_advantage(trainer: LoRATrainer) -> None:
    seqs = make_sequences(trainer, [12, 10, 14, 9], [1.0, -1.0, 0.0, 0.0])
    before = [completion_logprob(trainer, s) for s in seqs]
    config = TrainConfig(learning_rate=LR)

    m = trainer.rl_step(seqs, config)

    assert_finite(m)
    n = 4 * TAIL
    # Ratio 1 everywhere: the loss is -sum(A_t) / N = -(5 * 1 - 5 * 1) / 20.
    assert m["loss"] == pytest.approx(0.0, abs=1e-6)
    assert m["policy_loss"] == pytest.approx(0.0, abs=1e-6)
    assert m["grad_norm"] > 0
    assert m["trainable_tokens"] == n
    assert m["sequences"] == 4
    assert m["learning_rate"] == LR
    assert m["clip_fraction"] == 0.0
    assert m["kl"] == 0.0
    assert m["mismatch/abs_diff_mean"] < 1e-5
    assert m["mismatch/abs_diff_max"] < 1e-5
    assert m["mismatch/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert 0 <= m["padding_waste"] < 1

    after = [completion_logprob(trainer, s) for s in seqs]
    assert after[0] > before[0] + 1e-3  # positive advantage: more likely
    assert after[1] < before[1] - 1e-3  # negative advantage: less likely


def test_rl_step_reports_progress(trainer: LoRATrainer) -> None:
    seqs = make_sequences(trainer, [12, 10, 14], [1.0, -1.0, 0.5])
    events: list[tuple[str, dict[str, Any]]] = []
    config = TrainConfig(learning_rate=LR, max_seq_length=16, micro_batch_tokens=16)
    trainer.rl_step(seqs, config, progress=lambda stage, info: events.append((stage, info)))
    stages = [s for s, _ in events]
    assert stages == ["micro_batch"] * 3 + ["optimizer_step"]
    assert sum(info["tokens"] for _, info in events[:-1]) == 3 * TAIL
    assert events[-1][1]["grad_norm"] > 0


def test_rl_step_measures_sampler_mismatch(trainer: LoRATrainer) -> None:
    seqs = make_sequences(trainer, [12, 10], [1.0, -1.0], offset=-0.1)
    m = trainer.rl_step(seqs, TrainConfig(learning_rate=LR))
    assert m["mismatch/abs_diff_mean"] == pytest.approx(0.1, abs=1e-5)
    assert m["mismatch/ratio_mean"] == pytest.approx(math.exp(0.1), rel=1e-5)


# --------------------------------------------------------------------------- variants


@pytest.fixture
def stepped(trainer: LoRATrainer) -> LoRATrainer:
    """A trainer one step away from its zero-initialised LoRA B (so the adapter matters)."""
    warm = make_sequences(trainer, [12, 10], [1.0, -1.0], seed=99)
    trainer.rl_step(warm, TrainConfig(learning_rate=LR))
    return trainer


ADV = [1.0, -1.0, 0.5, 2.0]
LENGTHS = [12, 10, 14, 9]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # per token -A (ratio 1); N = 20 tokens, S = 4 sequences.
        ({}, lambda lp: -TAIL * sum(ADV) / (4 * TAIL)),
        ({"loss_normalization": "sequence_mean"}, lambda lp: -sum(ADV) / 4),
        (
            {"loss_normalization": "constant", "loss_constant": 100.0},
            lambda lp: -TAIL * sum(ADV) / 100.0,
        ),
        ({"importance_sampling_level": "sequence"}, lambda lp: -TAIL * sum(ADV) / (4 * TAIL)),
        ({"truncated_is_cap": 2.0}, lambda lp: -TAIL * sum(ADV) / (4 * TAIL)),
        ({"epsilon_high": 0.28}, lambda lp: -TAIL * sum(ADV) / (4 * TAIL)),
        # CISPO: per token -clip(1) * A * logprob.
        (
            {"policy_loss": "cispo"},
            lambda lp: -sum(a * x for a, x in zip(ADV, lp, strict=True)) / (4 * TAIL),
        ),
    ],
    ids=["token_mean", "sequence_mean", "constant", "gspo", "tis", "clip_higher", "cispo"],
)
def test_loss_variants_match_hand_computed_values(
    stepped: LoRATrainer, kwargs: dict[str, Any], expected: Any
) -> None:
    seqs = make_sequences(stepped, LENGTHS, ADV)
    lp = [completion_logprob(stepped, s) for s in seqs]
    m = stepped.rl_step(seqs, TrainConfig(learning_rate=LR, **kwargs))
    assert_finite(m)
    assert m["grad_norm"] > 0
    assert m["loss"] == pytest.approx(expected(lp), abs=1e-5)


def test_kl_penalty_is_zero_at_the_base_and_positive_after_training(
    trainer: LoRATrainer,
) -> None:
    seqs = make_sequences(trainer, [12, 10], [1.0, -1.0])
    config = TrainConfig(learning_rate=LR, beta=0.5)
    first = trainer.rl_step(seqs, config)  # LoRA B starts at zero: the policy is the base
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)
    second = trainer.rl_step(seqs, config)
    assert_finite(second)
    assert second["kl"] > 0
    # The KL term is in the loss: loss = policy loss + beta * mean k3.
    assert second["loss"] == pytest.approx(second["policy_loss"] + 0.5 * second["kl"], abs=1e-6)


@pytest.mark.parametrize(
    "normalization", [{}, {"loss_normalization": "sequence_mean"}], ids=["token", "seq"]
)
def test_loss_and_gradient_do_not_depend_on_packing_or_micro_batches(
    stepped: LoRATrainer, normalization: dict[str, Any]
) -> None:
    # Off-policy sampler logprobs (ratio exp(0.15) for most tokens); sequence 2 (A < 0, ratio
    # exp(-0.25) < 0.8) and sequence 3 (A > 0, ratio exp(0.55) > 1.2) take the clipped branch.
    seqs = make_sequences(stepped, [12, 10, 14, 9, 7], [1.0, -1.0, -0.5, 2.0, -0.3], offset=-0.15)
    seqs[2].sampler_logprobs = [x + 0.4 for x in seqs[2].sampler_logprobs]
    seqs[3].sampler_logprobs = [x - 0.4 for x in seqs[3].sampler_logprobs]
    start = lora_state(stepped)
    layouts = {
        "packed-one-batch": {"pack_sequences": True, "micro_batch_tokens": 10_000},
        "padded-one-batch": {"pack_sequences": False, "micro_batch_tokens": 10_000},
        "packed-small": {"pack_sequences": True, "micro_batch_tokens": 16},
        "padded-small": {"pack_sequences": False, "micro_batch_tokens": 16},
    }
    results = {}
    for name, layout in layouts.items():
        restore(stepped, start)
        config = TrainConfig(learning_rate=LR, max_seq_length=24, **layout, **normalization)
        results[name] = rl_step_counting_micro_batches(stepped, seqs, config)
    assert results["packed-small"]["micro_batches"] > 1
    assert results["padded-small"]["micro_batches"] > 1
    ref = results["packed-one-batch"]
    assert ref["clip_fraction"] == pytest.approx(2 * TAIL / (5 * TAIL))
    for name, m in results.items():
        assert m["loss"] == pytest.approx(ref["loss"], abs=1e-5), name
        assert m["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), name
        assert m["clip_fraction"] == ref["clip_fraction"], name


def group_sequences(
    trainer: LoRATrainer, seed: int, prompt: int, extra: int, system: int = 0
) -> list[TrainSequence]:
    """Two groups of three sequences with a `prompt`-token common prompt each (rests of
    `extra` + m + k tokens), off-policy sampler logprobs; with `system`, both prompts
    start with the same `system` tokens (a prefix tree: the system prompt, then each task)."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    common = torch.randint(3, 2000, (system,), generator=g).tolist()
    for k in range(2):
        head = [*common, 1 + k, *torch.randint(3, 2000, (prompt - 1,), generator=g).tolist()]
        for m, adv in enumerate((1.0, -1.0, 0.5)):
            tokens = head + torch.randint(3, 2000, (extra + m + k,), generator=g).tolist()
            trainable = [i >= len(head) for i in range(len(tokens))]
            lp = logprobs(trainer, tokens)
            sampler = [x - 0.1 * m if t else math.nan for x, t in zip(lp, trainable, strict=True)]
            seqs.append(TrainSequence(tokens, trainable, sampler, adv))
    return seqs


def step_and_gradients(
    trainer: LoRATrainer, seqs: list[TrainSequence], config: TrainConfig
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One rl_step's metrics and its LoRA gradients (after backward, before the optimizer)."""
    grads: dict[str, torch.Tensor] = {}

    def progress(stage: str, info: dict[str, Any]) -> None:
        if stage == "micro_batch":
            grads.update(
                {
                    n: p.grad.clone()
                    for n, p in trainer.model.named_parameters()
                    if p.grad is not None
                }
            )

    return trainer.rl_step(seqs, config, progress), grads


def assert_same_step(
    a: tuple[dict[str, float], dict[str, torch.Tensor]],
    b: tuple[dict[str, float], dict[str, torch.Tensor]],
) -> None:
    """Loss, clip fraction, grad norm and every parameter's gradient agree."""
    (ma, ga), (mb, gb) = a, b
    for key in ("loss", "policy_loss", "clip_fraction", "trainable_tokens"):
        assert ma[key] == pytest.approx(mb[key], abs=1e-6), key
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-4)
    assert ga.keys() == gb.keys() and ga
    scale = max(float(g.abs().max()) for g in gb.values())
    for n, g in ga.items():  # the same gradient, parameter by parameter
        torch.testing.assert_close(g, gb[n], atol=1e-4 * scale, rtol=0)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"loss_normalization": "sequence_mean"}, {"beta": 0.5}, {"policy_loss": "cispo"}],
    ids=["token_mean", "sequence_mean", "kl", "cispo"],
)
def test_identical_sequences_trained_once_make_the_same_step(
    stepped: LoRATrainer, kwargs: dict[str, Any]
) -> None:
    seqs = group_sequences(stepped, seed=5, prompt=20, extra=4, system=16)
    repeated = [*seqs, replace(seqs[0]), replace(seqs[0]), replace(seqs[4])]
    merged, n = merge_duplicates(repeated)
    assert n == 3 and [s.copies for s in merged] == [3, 1, 1, 1, 2, 1]
    config = TrainConfig(learning_rate=LR, **kwargs)
    start = lora_state(stepped)
    each = step_and_gradients(stepped, repeated, config)
    restore(stepped, start)
    once = step_and_gradients(stepped, merged, config)
    assert_same_step(each, once)
    assert each[0]["sequences"] == once[0]["sequences"] == 9
    assert each[0]["kl"] == pytest.approx(once[0]["kl"], abs=1e-7)


def test_shared_prefixes_leave_loss_and_gradient_unchanged(stepped: LoRATrainer) -> None:
    seqs = group_sequences(stepped, seed=3, prompt=20, extra=4, system=16)
    start = lora_state(stepped)
    results = {}
    for share in (False, True):
        restore(stepped, start)
        config = TrainConfig(learning_rate=LR, share_prefixes=share)
        results[share] = step_and_gradients(stepped, seqs, config)
    # Each group's prompt written once, and the system prompt once for both groups.
    assert results[True][0]["shared_prefix_tokens"] == 2 * 2 * (16 + 19) + 16
    assert results[False][0]["shared_prefix_tokens"] == 0
    assert_same_step(results[True], results[False])


def test_auto_checkpointing_recomputes_only_what_exceeds_the_budget(
    stepped: LoRATrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_langgraph.training import activations

    assert stepped.config.gradient_checkpointing == "auto" and stepped._checkpointed
    seqs = make_sequences(stepped, LENGTHS, ADV, offset=-0.1)
    start = lora_state(stepped)
    seen: dict[str, list[bool]] = {}
    losses = {}
    mb = next(iter(stepped._micro_batches(seqs, TrainConfig(learning_rate=LR))[0]))
    half = mb.input_ids.numel() * stepped._activation_bytes // 2
    cases = (("small", activations.AUTO_CHECKPOINT_BYTES), ("large", 0), ("half", half))
    for name, limit in cases:
        monkeypatch.setattr(activations, "AUTO_CHECKPOINT_BYTES", limit)
        restore(stepped, start)
        losses[name] = stepped.rl_step(seqs, TrainConfig(learning_rate=LR))
        seen[name] = [bool(m.gradient_checkpointing) for m in stepped._checkpointed]
    assert not any(seen["small"])  # a few hundred tokens of the tiny model: kept
    assert all(seen["large"])  # over the limit: recomputed
    # sequences alone, twice the budget: cut into smaller micro-batches, none recomputed
    assert not any(seen["half"])
    for name in ("large", "half"):
        assert losses["small"]["loss"] == pytest.approx(losses[name]["loss"], abs=1e-6)
        assert losses["small"]["grad_norm"] == pytest.approx(losses[name]["grad_norm"], rel=1e-5)


def test_a_prefix_tree_over_the_budget_recomputes_only_some_layers(
    stepped: LoRATrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_langgraph.training import activations

    seqs = group_sequences(stepped, seed=3, prompt=20, extra=4, system=16)
    config = TrainConfig(learning_rate=LR)
    (mb,) = stepped._micro_batches(seqs, config)[0]  # one tree: cutting it would lose sharing
    assert mb.stats["shared_prefix_tokens"] > 0
    start = lora_state(stepped)
    seen, results = {}, {}
    need = mb.input_ids.numel() * stepped._activation_bytes
    per_layer = need // len(stepped._checkpointed)
    # over the budget by half a layer's activations: one layer recomputed brings it under
    for name, limit in (("all", 0), ("half", need - per_layer // 2), ("none", 2 * need)):
        monkeypatch.setattr(activations, "AUTO_CHECKPOINT_BYTES", limit)
        restore(stepped, start)
        results[name] = stepped.rl_step(seqs, config)
        seen[name] = [bool(m.gradient_checkpointing) for m in stepped._checkpointed]
    assert all(seen["all"]) and not any(seen["none"])
    # the fewest layers that bring it under, the first ones, not all
    assert 0 < sum(seen["half"]) < len(seen["half"]) and seen["half"][0]
    assert seen["half"] == sorted(seen["half"], reverse=True)
    for name in ("all", "half"):
        assert results[name]["loss"] == pytest.approx(results["none"]["loss"], abs=1e-6)
        assert results[name]["grad_norm"] == pytest.approx(results["none"]["grad_norm"], rel=1e-5)


def test_packed_loss_is_right_with_eager_attention(stepped: LoRATrainer) -> None:
    base: Any = stepped.model.base_model.model
    base.set_attn_implementation("eager")
    seqs = make_sequences(stepped, [12, 10, 14, 9], ADV)
    start = lora_state(stepped)
    losses = []
    for pack in (True, False):
        restore(stepped, start)
        config = TrainConfig(learning_rate=LR, max_seq_length=32, pack_sequences=pack)
        losses.append(stepped.rl_step(seqs, config)["loss"])
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


# --------------------------------------------------------------------------- state on disk


def test_resume_continues_exactly(make_trainer: Callable[[], LoRATrainer], tmp_path: Path) -> None:
    a = make_trainer()
    step1 = make_sequences(a, [12, 10, 14], [1.0, -1.0, 0.5], seed=1)
    step2 = make_sequences(a, [11, 13, 9], [-0.5, 1.5, 1.0], seed=2)
    config = TrainConfig(learning_rate=LR)
    a.rl_step(step1, config)
    saved = tmp_path / "step1"
    saved.mkdir()
    a.save(saved)
    a.rl_step(step2, config)

    files = {p.name for p in saved.iterdir()}
    assert (
        ADAPTER_FILES | OPTIMIZER_FILES <= files <= ADAPTER_FILES | OPTIMIZER_FILES | {"README.md"}
    )
    assert not any(p.suffix in {".pt", ".pth", ".bin", ".pkl", ".pickle"} for p in saved.iterdir())

    b = make_trainer()
    b.load(saved)
    b.rl_step(step2, config)
    state_a, state_b = lora_state(a), lora_state(b)
    assert state_a.keys() == state_b.keys() and state_a
    for name in state_a:
        torch.testing.assert_close(state_b[name], state_a[name], atol=1e-6, rtol=0)

    # Control: the same adapter without its optimizer state lands somewhere else.
    weights_only = tmp_path / "weights-only"
    shutil.copytree(saved, weights_only)
    for name in OPTIMIZER_FILES:
        (weights_only / name).unlink()
    c = make_trainer()
    c.load(weights_only)
    c.rl_step(step2, config)
    state_c = lora_state(c)
    assert any(not torch.allclose(state_c[n], state_a[n], atol=1e-6) for n in state_a)


def test_load_restores_the_adapter_weights(
    make_trainer: Callable[[], LoRATrainer], tmp_path: Path
) -> None:
    a = make_trainer()
    seqs = make_sequences(a, [12, 10], [1.0, -1.0])
    a.rl_step(seqs, TrainConfig(learning_rate=LR))
    a.save(tmp_path)
    b = make_trainer()
    assert completion_logprob(b, seqs[0]) != pytest.approx(completion_logprob(a, seqs[0]))
    b.load(tmp_path)
    assert completion_logprob(b, seqs[0]) == pytest.approx(completion_logprob(a, seqs[0]), abs=1e-6)


# --------------------------------------------------------------------------- sft_step


def test_sft_step_lowers_the_nll_of_the_trained_tokens(trainer: LoRATrainer) -> None:
    seqs = make_sequences(trainer, [12, 10, 14], [1.0, 1.0, 1.0], tail=6)
    n = sum(s.num_trainable for s in seqs)

    def nll() -> float:
        return -sum(completion_logprob(trainer, s) for s in seqs) / n

    start = nll()
    config = TrainConfig(learning_rate=5e-3)
    first = trainer.sft_step(seqs, config)
    assert first["loss"] == pytest.approx(start, abs=1e-5)  # the loss is the token-mean NLL
    assert first["grad_norm"] > 0
    assert first["trainable_tokens"] == n
    assert 0 <= first["sure_sequences"] <= len(seqs)
    for _ in range(4):
        m = trainer.sft_step(seqs, config)
        assert_finite(m)
    assert nll() < start - 0.1


def test_bfloat16_steps_on_the_cpu_bucket_widths_which_change_no_loss_or_gradient(
    stepped: LoRATrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import art_langgraph.training.trainer as T
    from art_langgraph.engine.packed_linear import bucket_rows

    seqs = group_sequences(stepped, seed=3, prompt=20, extra=4, system=16)
    asked: list[bool] = []
    forced: list[bool] = []
    widths: list[list[int]] = []

    def micro_batches(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["bucket_width"])
        if forced:
            kwargs["bucket_width"] = forced[-1]
        batches = list(tensorize.micro_batches(*args, **kwargs))
        widths.append([mb.input_ids.shape[1] for mb in batches])
        return iter(batches)

    monkeypatch.setattr(T, "micro_batches", micro_batches)
    stepped.sft_step(seqs, TrainConfig(learning_rate=LR, sft_compute_dtype="bfloat16"))
    stepped.sft_step(seqs, TrainConfig(learning_rate=LR))
    assert asked == [True, False]  # oneDNN keeps a kernel per bfloat16 row count
    start = lora_state(stepped)
    results = {}
    for bucket in (False, True):
        restore(stepped, start)
        forced.append(bucket)
        results[bucket] = step_and_gradients(stepped, seqs, TrainConfig(learning_rate=LR))
    plain, bucketed = widths[-2:]
    assert bucketed == [bucket_rows(w) for w in plain] != plain
    assert_same_step(results[True], results[False])


def test_an_sft_step_in_bfloat16_trains_alike_and_leaves_rl_steps_in_the_models_dtype(
    trainer: LoRATrainer,
) -> None:
    seqs = make_sequences(trainer, [12, 10, 14], [1.0, 1.0, 1.0], tail=6)
    start = lora_state(trainer)
    fp32 = trainer.sft_step(seqs, TrainConfig(learning_rate=5e-3, sft_compute_dtype="model"))
    restore(trainer, start)
    bf16 = trainer.sft_step(seqs, TrainConfig(learning_rate=5e-3, sft_compute_dtype="bfloat16"))
    assert bf16["loss"] != fp32["loss"]  # it did compute in bfloat16
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=0.05)
    assert trainer.compute_dtype == trainer.dtype == torch.float32  # RL's, restored


def test_an_sft_step_recomputes_by_its_own_budget_and_rl_steps_by_theirs(
    stepped: LoRATrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_langgraph.training import activations

    seqs = make_sequences(stepped, [12, 10, 14], [1.0, 1.0, 1.0], tail=6)
    config, start = TrainConfig(learning_rate=5e-3), lora_state(stepped)
    recomputed, losses = {}, {}
    # the RL budget at nothing must not reach an SFT step, and the SFT one must not reach RL
    monkeypatch.setattr(activations, "AUTO_CHECKPOINT_BYTES", 0)
    for name, limit in (("kept", 2**40), ("all", 0)):
        monkeypatch.setattr(activations, "SFT_CHECKPOINT_BYTES", limit)
        restore(stepped, start)
        losses[name] = stepped.sft_step(seqs, config)["loss"]
        recomputed[name] = [bool(m.gradient_checkpointing) for m in stepped._checkpointed]
    assert not any(recomputed["kept"]) and all(recomputed["all"])
    # the budget changes no loss: recomputing may reorder a sum, a float32 ulp or two at ~8.5
    assert losses["kept"] == pytest.approx(losses["all"], rel=1e-6)
    stepped.rl_step(make_sequences(stepped, [12, 10], [1.0, -1.0]), config)
    assert all(m.gradient_checkpointing for m in stepped._checkpointed)  # RL's budget: 0


def saved_bytes_per_token(trainer: LoRATrainer, tokens: int) -> float:
    """What one forward of the trainer's transformer keeps for its backward, per token, no
    layer recomputed: the saved tensors' storages, each once, less the parameters'."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(3, 2000, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), trainer._autocast():
        trainer.model.get_base_model().model(input_ids=ids)
    params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params) / tokens


@pytest.mark.parametrize("sft_dtype", ["model", "bfloat16"])
def test_the_activation_estimate_covers_what_a_step_keeps(
    trainer: LoRATrainer, sft_dtype: str
) -> None:
    # bfloat16 autocast over float32 weights keeps the float32 stream and bfloat16 copies:
    # an estimate at 2 bytes a value let an SFT step keep twice the layers it had room for
    for layer in trainer._checkpointed:
        layer.gradient_checkpointing = False
    with trainer._sft_precision(TrainConfig(sft_compute_dtype=sft_dtype)):
        assert saved_bytes_per_token(trainer, 64) <= trainer._activation_bytes


@pytest.mark.parametrize("step", ["rl_step", "sft_step"])
def test_a_step_with_no_trainable_tokens_is_a_finite_no_op(trainer: LoRATrainer, step: str) -> None:
    seqs = [TrainSequence([5, 6, 7, 8], [False] * 4, [math.nan] * 4, 1.0)]
    before = lora_state(trainer)
    m = getattr(trainer, step)(seqs, TrainConfig(learning_rate=LR))
    assert_finite(m)
    assert m["trainable_tokens"] == 0
    for name, value in lora_state(trainer).items():
        assert torch.equal(value, before[name])


def test_token_logprobs_equal_a_full_log_softmax_in_value_and_gradient() -> None:
    """The chunked, recomputed head gives what (N, V) logits + log_softmax give, gradients too."""
    from art_langgraph.training.logprobs import token_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(7, 16, requires_grad=True)  # (N, H)
    targets = torch.randint(0, 50, (7,))  # (N,)
    want = torch.log_softmax(head(hidden), -1)[torch.arange(7), targets]  # (N,)
    (g_want,) = torch.autograd.grad(want.sum(), hidden)
    got = token_logprobs(hidden, head, targets, chunk=3)  # 3 chunks: 3, 3, 1 rows
    (g_got,) = torch.autograd.grad(got.sum(), hidden)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(g_got, g_want, atol=1e-6)
    assert token_logprobs(hidden[:0], head, targets[:0]).shape == (0,)


def test_a_trainer_step_is_the_same_with_segments_and_the_dense_mask(
    stepped: LoRATrainer,
) -> None:
    seqs = group_sequences(stepped, seed=5, prompt=24, extra=5, system=20)  # one tree
    alone = torch.randint(3, 2000, (11,), generator=torch.Generator().manual_seed(6)).tolist()
    seqs.append(TrainSequence(alone, [i >= 6 for i in range(11)], logprobs(stepped, alone), -0.5))
    start = lora_state(stepped)
    results = {}
    for segmented in (False, True):
        stepped.config = stepped.config.model_copy(update={"segmented_attention": segmented})
        restore(stepped, start)
        results[segmented] = step_and_gradients(stepped, seqs, TrainConfig(learning_rate=LR))
    assert results[True][0]["shared_prefix_tokens"] > 0
    assert_same_step(results[True], results[False])
