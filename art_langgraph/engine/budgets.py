"""The torch engine's memory budgets: how many bytes its KV cache and prefix cache may hold.

`kv_token_bytes` is the KV cache one token takes under a model's config;
`kv_budget` and `prefix_budget` turn `TorchEngineConfig.max_kv_bytes` and
`prefix_cache_bytes` into bytes, picking the defaults from the device's memory
(`device_memory`: the machine's RAM for the CPU) and refusing a prefix cache larger than
the device.

Left out: enforcing them (the engine's admission holds a request back past `kv_budget`;
`engine/prefix_cache.py` evicts past its budget), and measuring memory actually in use.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from art_langgraph.errors import UsageError


def device_memory(device: torch.device) -> int:
    """Bytes of memory of `device` (the machine's RAM for the CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def kv_token_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes of KV cache one token takes: keys and values of every layer's KV heads."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.empty((), dtype=dtype).element_size()
    return int(config.num_hidden_layers) * 2 * int(heads) * int(head_dim) * element


def kv_budget(budget: int | None, device: torch.device) -> int:
    """The running batch's KV budget in bytes (`TorchEngineConfig.max_kv_bytes`; 0: none)."""
    if budget is not None:
        return budget
    total = device_memory(device)
    return total // 4 if device.type == "cuda" else min(total // 16, 512 << 20)


def prefix_budget(budget: int | None, device: torch.device) -> int:
    """The prefix cache's budget in bytes (`TorchEngineConfig.prefix_cache_bytes`; the config
    refuses negative budgets, this the ones beyond the device)."""
    total = device_memory(device)
    if budget is None:
        return min(total // 32, 1 << 30) if device.type == "cuda" else min(total // 64, 256 << 20)
    if budget > total:
        raise UsageError(
            f"prefix_cache_bytes={budget} is more than the {device.type} device's memory "
            f"({total} bytes); pick a smaller budget, or None for the default"
        )
    return budget
