"""The trainer's activation budget: what a micro-batch keeps for its backward pass, and how
many decoder layers recompute under `gradient_checkpointing="auto"`.

Pure arithmetic over a model's sizes (`activation_bytes_per_token`) and a byte budget:
`layers_to_recompute` for one micro-batch, and the token caps `alone_tokens` (micro-batches
of sequences alone, cut to fit and recomputing nothing) and `tree_tokens` (micro-batches
holding a prefix tree, never cut, recomputing every layer). The trainer
(`training/trainer.py`) reads `AUTO_CHECKPOINT_BYTES` (an RL step's) and
`SFT_CHECKPOINT_BYTES` (an SFT step's) when it uses them, so a benchmark or test may patch
them here. Left out: measuring memory (bench.checkpoint_budget does).
"""

from __future__ import annotations

import math
from typing import Any

AUTO_CHECKPOINT_BYTES = 256 * 2**20
"""gradient_checkpointing="auto" keeps a micro-batch's activations under this: micro-batches
without a prefix tree are cut to fit it, trees recompute as many layers as it takes, and
the head's logits are kept when they fit a quarter of it. bench.checkpoint_budget: 256 MiB
against 1 GiB costs an agent batch 5% of its step time and saves 470 MiB of peak; a whole
real-model `art-mcp train` run, engine and trainer in one process, peaked at 4.1 GiB with
1 GiB, past the 4 GiB it may take."""


SFT_CHECKPOINT_BYTES = 1024 * 2**20
"""The budget of an SFT warm-start step (`LoRATrainer.sft_step`), in place of
`AUTO_CHECKPOINT_BYTES`: a warm start's batch of demonstrations is one prefix tree (8
capitals demonstrations, ~1,500 tokens), which 256 MiB makes recompute 29 of SmolLM2-135M's
30 layers. bench.probes.sft_step (float32, 2-core AVX512-BF16 host): 1 GiB took a step
0.84x as long, for 3.4 GB of peak RSS against 3.0 (the trainer alone); the loss is the
same. An SFT step runs before RL with nothing else training, so its peak stays under the
RL steps' (which keep 256 MiB)."""


def activation_bytes_per_token(config: Any, element_size: int) -> int:
    """What the backward pass keeps per token without checkpointing, for a llama-like
    decoder with LoRA on every projection, in a dtype of `element_size` bytes: per layer,
    the norms' inputs, the projections' inputs (the LoRA weights' gradients need them),
    queries, keys, values and the attention output, and the MLP's inner activations.
    Measured on SmolLM2-135M (saved-tensor hooks over one forward of an 8 x 4 agent
    micro-batch, fp32): 55 KB a layer and token, about 12 x hidden + 5 x intermediate
    values."""
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    inner = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    return layers * (12 * hidden + 5 * inner) * element_size


def layers_to_recompute(
    tokens: int, layers: int, activation_bytes: int, layer_input_bytes: int, budget: int
) -> list[bool]:
    """Which of `layers` checkpointable layers recompute a micro-batch of `tokens` (the
    first k): just enough that the activations the others keep fit `budget` (none for a
    small micro-batch, all for a huge one). Each recomputed layer costs one more forward of
    that layer, so checkpointing k of n layers costs about k/n of a forward."""
    per_layer = tokens * activation_bytes / layers
    kept = tokens * layer_input_bytes  # a recomputed layer still keeps its input
    over = layers * per_layer - budget
    k = 0 if over <= 0 else min(layers, math.ceil(over / max(per_layer - kept, 1.0)))
    return [i < k for i in range(layers)]


def alone_tokens(budget: int, activation_bytes: int) -> int:
    """The most tokens of a micro-batch without a prefix tree whose activations fit
    `budget`, so it runs without recompute (more passes over the same tokens instead of a
    second forward); a tree keeps its size, since splitting it would compute its shared
    parts again."""
    return max(1, budget // activation_bytes)


def tree_tokens(budget: int, layers: int, activation_bytes: int, layer_input_bytes: int) -> int:
    """The most tokens of a micro-batch holding a prefix tree whose memory fits `budget`
    with every layer recomputed: each layer's input, kept through the forward, and one
    layer's activations, live while its backward recomputes it (at least one row: a tree
    is never split). Two 7,856-token trees in one pass took a BFCL step of SmolLM2-135M
    (fp32) 2.0 GiB above its resting 2.2 GiB; bench.checkpoint_budget --tree-caps on,off
    measures the cap."""
    per_token = layers * layer_input_bytes + activation_bytes / layers
    return max(1, int(budget // per_token))
