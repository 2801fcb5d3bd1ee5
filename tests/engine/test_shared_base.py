"""One copy of the frozen weights: the trainer's module tree over the engine's tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import art_langgraph as art
from art_langgraph.engine.shared_base import frozen_tensors, model_over
from tests.conftest import FP32


def test_a_model_over_shared_tensors_computes_the_same_and_copies_nothing(tiny_path: Path) -> None:
    src = AutoModelForCausalLM.from_pretrained(str(tiny_path)).eval()
    tensors = frozen_tensors(src)
    twin = model_over(tensors, src)
    ptrs = {t.data_ptr() for t in tensors.values()}
    assert {p.data_ptr() for p in twin.parameters()} <= ptrs
    assert {b.data_ptr() for b in twin.buffers()} <= ptrs
    assert not any(p.requires_grad for p in twin.parameters())
    if src.config.tie_word_embeddings:
        assert twin.lm_head.weight is twin.model.embed_tokens.weight
    ids = torch.tensor([[1, 5, 9, 13, 7, 3]])
    with torch.no_grad():
        assert torch.equal(src(ids).logits, twin(ids).logits)
    with pytest.raises(ValueError, match="do not match"):
        model_over({k: v for k, v in tensors.items() if "layers.0." not in k}, src)


async def test_the_backend_trainer_trains_over_the_engine_weights(tmp_path: Path) -> None:
    from tests.backend.rollouts import rollout

    async with art.LocalBackend(path=tmp_path, engine=art.EngineChoice(config=FP32)) as backend:
        model = art.TrainableModel(name="shared", project="t", base_model="tiny")
        await model.register(backend)
        before = {k: v.clone() for k, v in backend.engine.shared_base.tensors.items()}
        trajs = [await rollout(model, f"count {i}", seed=i) for i in range(4)]
        for i, t in enumerate(trajs):
            t.reward = float(i % 2)
        result = await model.train(
            [art.TrajectoryGroup(trajs)], art.TrainConfig(learning_rate=1e-2)
        )
        trainer = backend._runs["shared"].trainer
        assert trainer is not None and trainer.shares_base
        engine_ptrs = {t.data_ptr() for t in backend.engine.shared_base.tensors.values()}
        frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
        assert frozen and {p.data_ptr() for p in frozen} <= engine_ptrs  # no second copy
        after = backend.engine.shared_base.tensors
        assert all(torch.equal(before[k], after[k]) for k in before)  # the base never moves
        # token-exact: the engine (its own adapter layers) and the trainer agree
        assert result.metrics["mismatch/abs_diff_mean"] < 1e-4 and result.metrics["grad_norm"] > 0
        assert (await rollout(model, "after")).calls[0].model == "shared@1"
