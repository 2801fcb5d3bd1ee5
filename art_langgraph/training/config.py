"""Training settings: `TrainConfig` (one RL step) and `ModelConfig` (the LoRA adapter and its run).

Every field is documented in place with its unit, default, range and, for a choice, all
its options; the CLI and the docs' configuration page read these descriptions. Contradictory settings
are rejected at construction with a message that shows the values and the fix.

Left out: vLLM engine settings (they belong to the vLLM backend) and schedules for
the learning rate (one step per `train()` call, so a caller varies it per call).
"""

from __future__ import annotations

import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SWEPT_LEARNING_RATE = 1e-3
"""The learning rate bench.defaults_sweep chose on SmolLM2-135M-Instruct
(bench/results/defaults_sweep/defaults_sweep.json: one seed per setting, the bundled
capital/currency task)."""
_SWEPT_WIDTH = 576
"""SmolLM2-135M's hidden size, where SWEPT_LEARNING_RATE was chosen."""
_PRESET_WIDTHS = {"smollm2-135m": 576}


def default_learning_rate(base_model: str) -> tuple[float, str]:
    """The learning rate for `base_model` when none is given, and why, in words: the
    tiny preset's 5e-4; else `SWEPT_LEARNING_RATE` scaled by sqrt(576 / the model's hidden
    size), read from a preset's known width, a local folder's config.json or a Hub id's
    config in the Hugging Face cache; a model whose width cannot be read so (a Hub id not
    downloaded yet, a .gguf file) gets the swept value, and the reason says so."""
    if base_model == "tiny":
        return 5e-4, "the tiny preset's"
    width = _PRESET_WIDTHS.get(base_model) or _hidden_size(base_model)
    if width is None:
        return SWEPT_LEARNING_RATE, "swept on SmolLM2-135M (this model's width is unknown)"
    lr = SWEPT_LEARNING_RATE * math.sqrt(_SWEPT_WIDTH / width)
    if width == _SWEPT_WIDTH:
        return lr, "swept on SmolLM2-135M"
    return lr, f"swept on SmolLM2-135M (width 576), times sqrt(576 / {width})"


def _hidden_size(base_model: str) -> int | None:
    """The hidden size in the model's config.json (`devices.model_config_file`); None where
    there is none to read."""
    from art_langgraph.runtime.devices import model_config_file

    path = model_config_file(base_model)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text())
        return int(config.get("hidden_size") or config["text_config"]["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class TrainConfig(BaseModel):
    """How one `model.train(groups)` call turns trajectory groups into one optimizer step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float | None = Field(
        None,
        gt=0,
        description="AdamW learning rate. None (default): the base model's "
        "(`default_learning_rate`): SWEPT_LEARNING_RATE (1e-3), chosen by bench.defaults_sweep "
        "on SmolLM2-135M (hidden size 576), times sqrt(576 / hidden size) for other models (an "
        "extrapolation not measured beyond 135M; ART's 5e-6 is for 7B-32B models, which the "
        "rule puts at 3e-4-4e-4); 5e-4 for the tiny preset. Each step's metrics report the "
        "rate used.",
    )
    sft_compute_dtype: Literal["auto", "model", "float32", "bfloat16"] = Field(
        "model",
        description=(
            "Dtype of an SFT step's matmuls (`train_sft`), through autocast over the weights "
            "dtype. model: the trainer's (ModelConfig.compute_dtype), which RL steps always "
            "use (the sampler's precision, for their ratios); auto: bfloat16 where the device "
            "multiplies it in hardware (CUDA, AMX, AVX-512-BF16), else the model's; float32 "
            "or bfloat16: that. An SFT step has no sampler to agree with."
        ),
    )
    sft_frozen_root: bool = Field(
        False,
        description=(
            "In an SFT step whose micro-batch is a prefix tree (a warm start's demonstrations "
            "sharing a system prompt and tool specs), run the root they share once without "
            "gradient and backpropagate through each demonstration's own tokens only: the "
            "adapter's gradient through the root's keys and values is dropped. 0.69x an SFT "
            "step; off, as it taught the two-hop task less (docs/benchmarks.md#frozen-root). "
            "RL steps keep the whole gradient always."
        ),
    )
    beta: float = Field(
        0.0,
        ge=0,
        description="Weight of the KL penalty to the base model (adapter disabled), k3 estimator. "
        "0 (default) skips the reference forward pass entirely.",
    )
    scale_rewards: bool = Field(
        True,
        description="Divide each group's centred rewards by their population std (+1e-6), as ART and the "
        "GRPO paper do. False keeps only the centring (Dr. GRPO).",
    )
    signal_share_scale: bool = Field(
        False,
        description="Scale each step's loss by the share of its rollouts that carry a signal "
        "(those of groups whose rewards differ; a group with one reward for every rollout is "
        "still skipped, and counts as zero), as a mean over the whole batch does in TRL's GRPO: "
        "a step where one group of eight carries a signal moves the adapter an eighth as far. "
        "False (default): the loss is averaged over the trained groups alone (ART), so such a "
        "step moves it as far as a step where all eight do. Only the policy term is scaled "
        "(a `beta` KL term is not). Each step reports the share as `signal_share`.",
    )
    flat_groups: Literal["skip", "batch_baseline", "batch_baseline_positive"] = Field(
        "skip",
        description="What a group whose rollouts all got one reward (a flat group: no signal "
        "within it) trains on. skip (default; GRPO, ART, TRL): nothing; the step reports it in "
        "`zero_variance_groups`. batch_baseline: its rollouts' rewards against the step's "
        "mean reward over every rollout (divided by the step's population std when "
        "scale_rewards), so a question the policy already solves keeps saying 'keep doing "
        "this' and one it always fails says 'not this' (REINFORCE with a batch baseline "
        "where the group gives none); such groups are counted in `flat_groups_trained`. "
        "batch_baseline_positive: only the flat groups above the step's mean train so (a flat "
        "failure has no rollout to contrast with: its negative advantage pushes down every "
        "token of it, the right calls with the wrong answer); the others are skipped. A "
        "step whose rewards are all equal still trains on nothing. Groups that differ keep "
        "their group-relative advantages either way. Not with signal_share_scale (every "
        "rollout trains, so there is no share to scale by).",
    )
    repeated_calls: Literal["episode", "at_most_zero"] = Field(
        "episode",
        description="The advantage of a call whose tool calls all repeat tool calls an "
        "earlier call of the rollout made (name and arguments alike): episode (default; "
        "GRPO, ART): its rollout's, like any call; at_most_zero: its rollout's where "
        "negative, else 0, so a rollout that succeeds does not reinforce the calls in it "
        "that looked up again what it had (a repeated call's result is in the context "
        "already), while one that fails still pushes them down. Assumes a repeated call "
        "returns what it did: a polling tool wants episode. The step counts the calls so "
        "held at 0 in `repeated_calls_zeroed`.",
    )
    epsilon: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Lower clip range of the importance ratio: clip at 1 - epsilon. In (0, 1).",
    )
    epsilon_high: float | None = Field(
        None,
        gt=0,
        description="Upper clip range: clip at 1 + epsilon_high. None (default) uses epsilon. "
        "DAPO's clip-higher uses 0.28. For CISPO it is the only bound (the weight is capped at "
        "1 + epsilon_high, never floored).",
    )
    policy_loss: Literal["ppo", "cispo"] = Field(
        "ppo",
        description="ppo: PPO-clipped surrogate (GRPO). cispo: clipped importance-sampling weight times "
        "the log-probability (MiniMax-M1), which keeps a gradient on every token.",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="token: one ratio per token (GRPO). sequence: the geometric mean ratio of each "
        "sequence, applied to all of its tokens (GSPO).",
    )
    loss_normalization: Literal["token_mean", "sequence_mean", "constant"] = Field(
        "token_mean",
        description="token_mean: sum over all trainable tokens of the step / their count (DAPO). "
        "sequence_mean: mean within each sequence, then over sequences (GRPO paper). "
        "constant: sum / loss_constant (Dr. GRPO).",
    )
    loss_constant: float | None = Field(
        None,
        gt=0,
        description="The divisor for loss_normalization='constant' (e.g. max completion tokens × sequences).",
    )
    truncated_is_cap: float | None = Field(
        None,
        ge=1,
        description="Truncated importance sampling (sampler/trainer mismatch correction): when set, the "
        "clipped ratio is taken against the trainer's own logprobs and each token is weighted by "
        "min(exp(trainer - sampler), cap). None (default): the ratio is taken against the sampler's "
        "recorded logprobs, as ART does. Typical cap: 2.",
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this. None: no clipping."
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field(
        (0.9, 0.99), description="AdamW (beta1, beta2); each in [0, 1)."
    )
    max_seq_length: int = Field(
        4096,
        ge=8,
        description="Longest training sequence in tokens; longer ones are truncated (kept from the start) "
        "and counted in metrics as `truncated_sequences`.",
    )
    pack_sequences: bool = Field(
        True,
        description="Pack several sequences into one row of up to max_seq_length tokens (block-diagonal "
        "attention, positions restart per sequence). False: one sequence per padded row.",
    )
    share_prefixes: bool = Field(
        True,
        description="With pack_sequences: sequences whose prompts (all before their first sampled "
        "token) start alike for more than 16 tokens form a prefix tree in one row: the part all "
        "share (an agent's system prompt and tool specs) once, then each group's task once, then "
        "each sequence's rest attending to the parts above it; logprobs and gradients are "
        "unchanged. Trees grow to min(micro_batch_tokens, 8192) tokens (the attention benchmark "
        "in docs/benchmarks.md: 1.28x a step on an 8x4 agent batch at 4096-token micro-batches).",
    )
    micro_batch_tokens: int = Field(
        16384,
        ge=8,
        description="Tokens per forward/backward pass (rows × row length); gradients accumulate "
        "across micro-batches into one optimizer step. Lower it if memory runs out.",
    )
    allow_retokenize: bool = Field(
        False,
        description="Calls recorded without token ids (another provider) are re-rendered with the chat "
        "template and tokenized. Off by default: that is where retokenization drift comes from.",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="Reject groups with a call served by an adapter more than this many steps behind "
        "the step being trained (when serving continues during training). None: no bound.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.loss_normalization == "constant" and self.loss_constant is None:
            raise ValueError(
                "loss_normalization='constant' needs loss_constant (e.g. max completion tokens × "
                "sequences per step); got loss_constant=None"
            )
        if self.loss_constant is not None and self.loss_normalization != "constant":
            raise ValueError(
                f"loss_constant={self.loss_constant} is only used with loss_normalization='constant', "
                f"but loss_normalization={self.loss_normalization!r}: drop one"
            )
        if self.policy_loss == "cispo" and self.importance_sampling_level == "sequence":
            raise ValueError(
                "policy_loss='cispo' weights each token by its own ratio; importance_sampling_level="
                "'sequence' contradicts it: use 'token' with cispo, or policy_loss='ppo' for GSPO"
            )
        if self.flat_groups != "skip" and self.signal_share_scale:
            raise ValueError(
                f"flat_groups={self.flat_groups!r} trains flat groups too, so "
                "signal_share_scale's share would not be what trains: drop one"
            )
        b1, b2 = self.adam_betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"adam_betas must each be in [0, 1), got {self.adam_betas}")
        return self

    @property
    def clip_high(self) -> float:
        """The upper clip range actually used (epsilon_high, or epsilon)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def for_model(self, base_model: str) -> TrainConfig:
        """This config with its learning rate set: `base_model`'s (`default_learning_rate`)
        where none was given. The backend calls it before a step; the trainer needs a number."""
        if self.learning_rate is not None:
            return self
        return self.model_copy(update={"learning_rate": default_learning_rate(base_model)[0]})


class ModelConfig(BaseModel):
    """The LoRA adapter of a TrainableModel and how its run behaves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lora_r: int = Field(8, ge=1, description="LoRA rank. Default 8 (ART's).")
    lora_alpha: int = Field(
        16, ge=1, description="LoRA alpha; the update is scaled by alpha / r. Default 16 (ART's)."
    )
    lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on the LoRA input during training."
    )
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        min_length=1,
        description="Module names that get LoRA adapters. Default: all attention and MLP projections (ART's).",
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "Recompute activations in the backward pass to save memory. True: every layer, "
            "always; False: never; auto: keep each micro-batch's activations under 256 MiB "
            "(estimated from its tokens and the model's sizes): micro-batches of sequences "
            "alone are cut to fit it and recompute nothing; a prefix tree, which cutting "
            "would compute twice, recomputes as many decoder layers as it takes. The budget "
            "was chosen by the activation-budget benchmark in bench/ (docs/benchmarks.md): "
            "5% slower than 1 GiB on an agent batch, 470 MiB less, so a real-model run's "
            "engine and trainer fit 4 GiB together."
        ),
    )
    segmented_attention: bool = Field(
        True,
        description=(
            "Packed rows attend block by block (each sequence, shared head and rest over only "
            "the keys it sees; `training/segmented_attention.py`) instead of under one dense (L, L) mask, "
            "which costs every row its length squared. The same attention; False: the dense "
            "mask (a reference for tests)."
        ),
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "The trainer's frozen base weights. auto: the engine's dtype (bfloat16 on CUDA; on "
            "CPUs that multiply it in hardware, AMX or AVX-512-BF16, float32 for a model of at "
            "most 270M parameters, where it learned more, and bfloat16 above; float32 on other "
            "CPUs), so an embedded backend's trainer wraps the engine's own weights instead of a "
            "second copy. The LoRA weights and the optimizer stay float32."
        ),
    )
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "Dtype of the transformer's matmuls, through torch.autocast over the weights dtype "
            "(the head and log-softmax stay in the weights dtype). auto: in an embedded "
            "backend with dtype auto, the engine's weights dtype (the sampler's precision, no "
            "autocast); otherwise the weights dtype, except bfloat16 over float32 weights "
            "(dtype='float32' chosen for a model above 270M parameters) on CPUs that multiply it in hardware (AMX, AVX-512-BF16), "
            "where it is about twice as fast (see docs/benchmarks.md)."
        ),
    )
    serve_during_training: bool = Field(
        False,
        description="False (default, ART's semantics): requests for the model wait while a step trains "
        "and are then served by the new step. True: step N keeps serving during training; each call "
        "records its step and TrainConfig.max_staleness bounds how old a group may be.",
    )
    seed: int = Field(0, description="Seed for the LoRA initialisation.")
    promote_on_evaluation: bool = Field(
        False,
        description=(
            "False (default): the bare name serves the latest step. True: it serves the "
            "*promoted* step, and a step is promoted only through `await "
            "model.record_evaluation(step, score)` (its held-out score at least the promoted "
            "step's minus promotion_tolerance) or `art-langgraph promote`/`rollback`; the "
            "training rollouts (`model.chat_model()`, `model.openai_client()`) ask for "
            "`name@latest`. Turning it on promotes the latest step; decisions are kept in "
            "the model's folder (`promotion.jsonl`)."
        ),
    )
    promotion_tolerance: float = Field(
        0.02,
        ge=0,
        description=(
            "How far below the promoted step's held-out score a step may score and still be "
            "promoted, in the score's units. Default 0.02, for rewards in [0, 1]: below one "
            "scenario of a held-out set of up to 49 (1/49 > 0.02), so a scenario lost blocks "
            "promotion while the jitter of a continuous judge's score (RULER) or of float sums "
            "does not. 0: never serve a lower score. Raise it to about the score's standard "
            "error when evaluations are noisy. Used with promote_on_evaluation."
        ),
    )


def config_table(cls: type[BaseModel]) -> str:
    """A markdown table of a config's fields (name, default, meaning) from their descriptions."""
    rows = ["| field | default | meaning |", "|---|---|---|"]
    for name, f in cls.model_fields.items():
        default = f.default if f.default_factory is None else f.default_factory()  # type: ignore[call-arg]
        shown = (
            "None"
            if default is None
            else repr(default)
            if isinstance(default, str)
            else str(default)
        )
        meaning = " ".join((f.description or "").split()).replace("|", "/")
        rows.append(f"| `{name}` | `{shown}` | {meaning} |")
    return "\n".join(rows)
