"""TrainConfig / ModelConfig: defaults, range checks, cross-field rules and documentation."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from art_langgraph.model import TrainableModel
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.training.tensorize import TensorizeStats

CONFIGS: list[type[BaseModel]] = [TrainConfig, ModelConfig]


def test_the_learning_rate_is_the_base_models_unless_given(tmp_path) -> None:
    from art_langgraph.training.config import SWEPT_LEARNING_RATE

    assert TrainConfig().for_model("smollm2-135m").learning_rate == SWEPT_LEARNING_RATE
    assert TrainConfig().for_model("tiny").learning_rate == 5e-4
    (tmp_path / "config.json").write_text('{"hidden_size": 2304}')  # 4x SmolLM2's width
    assert TrainConfig().for_model(str(tmp_path)).learning_rate == pytest.approx(5e-4)
    given = TrainConfig(learning_rate=2e-5)
    assert given.for_model("smollm2-135m") is given


def test_train_config_defaults() -> None:
    c = TrainConfig()
    assert c.learning_rate is None  # the base model's, set by the backend (for_model)
    assert c.beta == 0.0
    assert c.scale_rewards is True
    assert c.epsilon == 0.2
    assert c.epsilon_high is None
    assert c.clip_high == 0.2
    assert c.policy_loss == "ppo"
    assert c.importance_sampling_level == "token"
    assert c.loss_normalization == "token_mean"
    assert c.loss_constant is None
    assert c.truncated_is_cap is None
    assert c.max_grad_norm == 1.0
    assert c.weight_decay == 0.0
    assert c.adam_betas == (0.9, 0.99)
    assert c.max_seq_length == 4096
    assert c.pack_sequences is True
    assert c.micro_batch_tokens == 16384
    assert c.allow_retokenize is False
    assert c.max_staleness is None


def test_clip_high_falls_back_to_epsilon() -> None:
    assert TrainConfig(epsilon=0.3).clip_high == 0.3
    assert TrainConfig(epsilon=0.2, epsilon_high=0.28).clip_high == 0.28
    assert TrainConfig(epsilon=0.3, epsilon_high=0.1).clip_high == 0.1


def test_model_config_defaults() -> None:
    m = ModelConfig()
    assert (m.lora_r, m.lora_alpha, m.lora_dropout) == (8, 16, 0.0)
    assert m.target_modules == (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    assert m.gradient_checkpointing == "auto"  # on for large micro-batches (4.8 -> 2.3 GiB)
    assert m.dtype == "auto"
    assert m.serve_during_training is False
    assert m.seed == 0


@pytest.mark.parametrize("cls", CONFIGS)
def test_configs_are_frozen(cls: type[BaseModel]) -> None:
    c = cls()
    name = next(iter(cls.model_fields))
    with pytest.raises(ValidationError, match="frozen"):
        setattr(c, name, getattr(c, name))


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        (
            {"loss_normalization": "constant"},
            ["loss_normalization='constant'", "loss_constant=None"],
        ),
        ({"loss_constant": 512}, ["loss_constant=512", "loss_normalization='token_mean'"]),
        (
            {"loss_constant": 64.5, "loss_normalization": "sequence_mean"},
            ["loss_constant=64.5", "loss_normalization='sequence_mean'"],
        ),
        (
            {"policy_loss": "cispo", "importance_sampling_level": "sequence"},
            ["policy_loss='cispo'", "importance_sampling_level='sequence'"],
        ),
        ({"adam_betas": (0.9, 1.0)}, ["(0.9, 1.0)"]),
        ({"adam_betas": (-0.1, 0.99)}, ["(-0.1, 0.99)"]),
        ({"adam_betas": (1.5, 0.99)}, ["(1.5, 0.99)"]),
    ],
)
def test_contradictions_are_rejected_showing_the_values(
    kwargs: dict[str, Any], shown: list[str]
) -> None:
    with pytest.raises(ValidationError) as info:
        TrainConfig(**kwargs)
    message = str(info.value)
    for text in shown:
        assert text in message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss_normalization": "constant", "loss_constant": 512},
        {"policy_loss": "cispo", "importance_sampling_level": "token"},
        {"policy_loss": "ppo", "importance_sampling_level": "sequence"},
        {"adam_betas": (0.0, 0.0)},
        {"epsilon_high": 0.28, "truncated_is_cap": 2.0, "beta": 0.04},
    ],
)
def test_consistent_settings_are_accepted(kwargs: dict[str, Any]) -> None:
    c = TrainConfig(**kwargs)
    for k, v in kwargs.items():
        assert getattr(c, k) == v


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0},
        {"epsilon": 1.0},
        {"learning_rate": 0.0},
        {"beta": -0.1},
        {"truncated_is_cap": 0.5},
        {"max_seq_length": 4},
        {"micro_batch_tokens": 0},
        {"loss_normalization": "sum"},
        {"policy_loss": "grpo"},
        {"max_staleness": -1},
    ],
)
def test_out_of_range_values_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TrainConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{"lora_r": 0}, {"lora_dropout": 1.0}, {"target_modules": ()}, {"dtype": "float16"}],
)
def test_model_config_out_of_range_values_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(("cls", "typo"), [(TrainConfig, "lr"), (ModelConfig, "rank")])
def test_unknown_fields_are_rejected(cls: type[BaseModel], typo: str) -> None:
    with pytest.raises(ValidationError, match=typo):
        cls(**{typo: 1})


@pytest.mark.parametrize("cls", CONFIGS)
def test_every_field_has_a_description(cls: type[BaseModel]) -> None:
    assert cls.model_fields
    for name, field in cls.model_fields.items():
        assert field.description and field.description.strip(), name


def _choices(annotation: Any) -> list[str]:
    """The options of a Literal field (possibly inside an Optional), else []."""
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    return [c for arg in typing.get_args(annotation) for c in _choices(arg)]


@pytest.mark.parametrize("cls", CONFIGS)
def test_choice_fields_document_every_option(cls: type[BaseModel]) -> None:
    for name, field in cls.model_fields.items():
        for option in _choices(field.annotation):
            assert option in (field.description or ""), (name, option)


def _step_metrics() -> dict[str, float]:
    """The metrics `prepare_step` reports for a one-group step."""
    from art_langgraph.training.prepare import prepare_step
    from art_langgraph.trajectories.trajectory import LLMCall, Trajectory, TrajectoryGroup

    def rollout(i: int) -> Trajectory:
        call = LLMCall(node="agent", prompt_token_ids=[1, 2], completion_token_ids=[3 + i])
        return Trajectory(id=f"t{i}", reward=float(i), calls=[call])

    return prepare_step([TrajectoryGroup([rollout(0), rollout(1)])], TrainConfig(), 1)[1]


def test_names_in_descriptions_are_real_fields_options_or_metrics() -> None:
    known = {n for cls in CONFIGS for n in cls.model_fields}
    known |= {
        o for cls in CONFIGS for f in cls.model_fields.values() for o in _choices(f.annotation)
    }
    known |= {f.name for f in dataclasses.fields(TensorizeStats)}  # metrics a description names
    known |= set(_step_metrics())  # and the metrics a step reports
    known |= {n for n in dir(TrainableModel) if not n.startswith("_")}  # the model's methods
    known |= {"default_learning_rate", "defaults_sweep"}  # the learning-rate rule, its sweep
    for cls in CONFIGS:
        for name, field in cls.model_fields.items():
            for word in re.findall(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b", field.description or ""):
                assert word in known, f"{cls.__name__}.{name} mentions unknown {word!r}"
