"""The trainer a `LocalBackend` runs beside its engine, and building it.

`build_trainer` turns a `TrainerChoice` (`backend/choices.py`) into a `Trainer` over the
base model, holding a model's latest checkpoint:

- one `LoRATrainer` in this process, over the engine's very weights when the engine
  shares them (`EngineTraits.shared_base`: our torch engine; one copy in memory);
- or `ranks` data-parallel ranks in worker processes or Ray actors (`DistributedTrainer`).

`training_config` resolves a model's `dtype="auto"` to the engine's weights dtype, so the
trainer computes in the sampler's precision.

Left out: what a step does (`training/`), and when a trainer is built, set aside or
rebuilt (`backend/local.py`).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from art_langgraph.backend.choices import TrainerChoice
from art_langgraph.engine.base import EngineTraits
from art_langgraph.runtime.allocator import glibc_warning
from art_langgraph.training.base import Trainer
from art_langgraph.training.config import ModelConfig

log = logging.getLogger(__name__)


def build_trainer(
    choice: TrainerChoice,
    base_path: str,
    config: ModelConfig,
    device: str | None,
    traits: EngineTraits,
    checkpoint: Path | None,
    *,
    ray: Any = None,
    share: Any = None,
) -> Trainer:
    """A trainer over the base model at `base_path`, with `config` (its `auto` dtypes
    resolved by `training_config`), holding `checkpoint`'s adapter and optimizer when
    given; `ray` and `share`: the engine's Ray placement, which the ranks join."""
    config = training_config(config, traits)
    if choice.ranks > 1 or ray is not None:
        from art_langgraph.scaleout.distributed import DistributedTrainer

        ranks = DistributedTrainer(
            base_path, config, choice.ranks, device, ray=ray, share=share, fsdp=choice.fsdp
        )
        if checkpoint is not None:
            ranks.load(checkpoint)  # a failure stops its ranks
        return ranks
    from art_langgraph.training.trainer import LoRATrainer

    trainer = LoRATrainer(base_path, config, device, shared=traits.shared_base)
    if trainer.device.type == "cpu":
        _warn_once_on_glibc()
    if checkpoint is not None:
        trainer.load(checkpoint)
    return trainer


def training_config(config: ModelConfig, traits: EngineTraits) -> ModelConfig:
    """`config` with `dtype="auto"` (and an `auto` compute dtype) resolved to the engine's
    weights dtype, so the trainer computes in the sampler's precision (and, on our
    engine, wraps its very tensors); `auto`'s machine rule (`devices.pick_dtype`) where
    the engine does not say."""
    name = traits.weights_dtype
    if config.dtype != "auto" or name not in ("float32", "bfloat16"):
        return config
    update = {"dtype": name}
    if config.compute_dtype == "auto":  # no autocast away from the sampler's precision
        update["compute_dtype"] = name
    return config.model_copy(update=update)


@functools.cache
def _warn_once_on_glibc() -> None:
    """Once a process: a CPU trainer under glibc's malloc peaks at 2-3x its live memory."""
    advice = glibc_warning()
    if advice:
        log.warning(advice)
