"""The engine's attention on the CPU: grouped-query heads handed to SDPA as they are.

transformers' SDPA attention (`sdpa_attention_forward`) gives torch's kernel grouped-query
heads as they are only without a mask; with one, it folds a single query token's heads
into its key/value heads (`pack_gqa`), and for more query tokens copies every key/value
head out to its query heads (`repeat_kv`). The engine always passes a mask (rows are
left-padded), and its fast-forward steps (a grammar's forced tokens), prefills over a
prefix-cache hit and multi-token decode steps have several query tokens: each copied the
whole batch's keys and values, every layer, every step. On the CPU torch's SDPA takes
grouped-query heads with a mask (`enable_gqa=True`, its flash kernel) and gives the same
output: for 32 rows of 800 keys, SmolLM2's 9 query and 3 key/value heads, 4 query tokens,
one thread, 13 ms against 108 for the copy (`bench.probes.gqa_attention`).

`register_gqa_attention()` registers `gqa_attention` with transformers under
`GQA_ATTENTION`; the torch engine sets it on its model on the CPU. Every other case (one
query token, no mask, no grouped heads, another device, a position bias or soft cap) goes
to transformers' own function unchanged. Left out: GPUs, where SDPA's fused kernels take
no grouped heads with a mask and transformers' choice stands.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

GQA_ATTENTION = "art_gqa_sdpa"
"""The name under which `gqa_attention` is registered with transformers."""


def gqa_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA over `query` (B, heads, q, D) and `key`/`value` (B, kv heads, S, D) under
    `attention_mask` (B or 1, 1, q, S), the key/value heads not copied; returns
    (B, q, heads, D) as transformers' attention functions do."""
    groups = getattr(module, "num_key_value_groups", 1)
    plain = (
        query.device.type != "cpu"
        or attention_mask is None
        or groups == 1
        or query.shape[2] == 1  # transformers folds a single token's heads already
        or any(kwargs.get(k) is not None for k in ("position_bias", "softcap", "s_aux"))
    )
    if plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )  # (B, heads, q, D)
    return out.transpose(1, 2).contiguous(), None


def register_gqa_attention() -> str:
    """Register `gqa_attention` (and SDPA's mask builder for it) with transformers
    (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(GQA_ATTENTION, gqa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_ATTENTION, sdpa_mask)
    return GQA_ATTENTION
