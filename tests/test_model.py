"""`TrainableModel`'s fields as an ART user expects them: `config` is the user's own."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import art_langgraph as art


class AgentConfig(BaseModel):
    max_turns: int = 5
    persona: str = "terse"


def test_config_is_the_users_own() -> None:
    model = art.TrainableModel(
        name="a", project="p", base_model="tiny", config=AgentConfig(max_turns=3)
    )
    assert model.config == AgentConfig(max_turns=3)
    assert model.training == art.ModelConfig()  # the LoRA settings have their own field
    tuned = art.TrainableModel(
        name="b", project="p", base_model="tiny", training=art.ModelConfig(lora_r=4)
    )
    assert tuned.training.lora_r == 4 and tuned.config is None


def test_a_model_config_given_as_config_is_refused_with_where_it_goes() -> None:
    """It would sit in `config` (the user's own settings) and never be trained with: a
    pydantic ValidationError naming the field."""
    with pytest.raises(ValueError, match=r"go in training=ModelConfig"):
        art.TrainableModel(
            name="a", project="p", base_model="tiny", config=art.ModelConfig(lora_r=4)
        )
