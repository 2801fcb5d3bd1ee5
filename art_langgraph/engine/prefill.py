"""Planning a prefill in the torch engine: where each new row's prompt starts, and which
rows share a head.

A row starts from the KV the prefix cache holds of its prompt (`PrefillStart.hit`), or
from a head its batch shares (`PrefillStart.head`): `prefix_clusters` picks the groups of
prompts whose common prefix is worth one forward (a GRPO group's prompt, an agent's
system prompt and tools), `fill_starts` lays every row's start into the KV cache the
prefill forward extends, right-aligned under left padding, and `prefill_inputs` lays out
the rest: each prompt's suffix after its start, its mask and positions. `padding_chunks`
splits rows of unlike lengths into forwards of their own, so that short rows are not
padded to the longest.

Left out: running the forward and merging its rows into the batch (`torch_engine.py`,
`batch.py`), and the cache across requests (`prefix_cache.py`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from art_langgraph.engine.kv_cache import preset_layer
from art_langgraph.engine.prefix_cache import PrefixHit


@dataclass
class PrefillStart:
    """The KV a row's prefill starts from: `tokens` steps from a prefix-cache `hit`, or
    from a `head` computed in this batch ((keys, values) per layer, (1, H, P, D))."""

    tokens: int
    hit: PrefixHit | None = None
    head: list[tuple[torch.Tensor, torch.Tensor]] | None = None


_MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are prefilled per row (a separate forward would cost more)."""


def prefix_clusters(prompts: list[list[int]], cached: list[int]) -> list[tuple[list[int], int]]:
    """Groups of prompts to prefill from one shared head: (their indices, the head's
    length), each group of two or more. The prompts are sorted, so a run of neighbours
    shares the least of their neighbouring common prefixes, and the runs are chosen to
    save the most prompt tokens: a GRPO batch holds each prompt several times (a group),
    and an agent's prompts share a system prompt and tools. A head leaves each row one
    token of its own, and is worth a run only when it is at least _MIN_SHARED_PREFIX
    tokens longer than what the prefix cache already holds of its rows (`cached`)."""
    n = len(prompts)
    if n < 2:
        return []
    order = sorted(range(n), key=lambda i: prompts[i])
    lcp = []
    for a, b in itertools.pairwise(order):
        x, y = prompts[a], prompts[b]
        m = min(len(x), len(y)) - 1
        lcp.append(max(next((k for k in range(m) if x[k] != y[k]), m), 0))
    best = [0] * (n + 1)  # best[j]: tokens saved over the first j sorted prompts
    cut: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (start of the last run, its head)
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], (j - 1, 0)
        shared, start = 1 << 30, cached[order[j - 1]]
        for i in range(j - 2, -1, -1):  # the run order[i:j]
            shared, start = min(shared, lcp[i]), max(start, cached[order[i]])
            if shared - start < _MIN_SHARED_PREFIX:
                break  # a longer run only shares less
            gain = best[i] + (j - 1 - i) * (shared - start)
            if gain > best[j]:
                best[j], cut[j] = gain, (i, shared)
    runs = []
    j = n
    while j > 0:
        i, shared = cut[j]
        if shared:
            runs.append(([order[k] for k in range(i, j)], shared))
        j = i
    return runs[::-1]


PREFILL_FORWARD_TOKENS = 64
"""What one more prefill forward costs, in token positions of prefill work: its fixed
work (~2,300 small operations, ~30 ms on 2 AVX2 cores, ~10 positions of a float32
SmolLM2-135M prefill) and its rows' merge into the running batch (at worst a copy of the
batch's KV) come to some tens; counted high, so rows of near lengths stay together."""


def padding_chunks(
    lengths: list[int], forward_tokens: int = PREFILL_FORWARD_TOKENS
) -> list[list[int]]:
    """Split rows whose prefill suffixes are `lengths` tokens into forwards (lists of row
    indices) so that the positions computed, each forward's rows times its longest row
    (left padding included), plus `forward_tokens` a forward, are the fewest. One forward
    pads every row to the longest: one-token rows after a shared head beside whole
    800-token prompts; over one BFCL evaluation, 1.17x the real tokens, 1.01x when split
    (bench.probes.bfcl_eval_cost). Rows of one length stay in one forward."""
    n = len(lengths)
    order = sorted(range(n), key=lambda i: lengths[i])
    best = [0] + [1 << 62] * n  # best[j]: the least cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        for i in range(j):
            cost = best[i] + (j - i) * longest + forward_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    chunks = []
    j = n
    while j > 0:
        chunks.append(order[cut[j] : j])
        j = cut[j]
    return chunks[::-1]


def head_kv(
    ids: list[list[int]],
    starts: list[PrefillStart],
    rows: list[Any],
    run: Callable[[list[list[int]], list[PrefillStart], list[Any]], tuple[Any, ...]],
) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """The KV of each cluster's head ((keys, values) a layer, (1, H, P, D), its real
    columns): the heads `ids`, each after its `starts`, prefilled for their first `rows`
    in forwards of like lengths (`padding_chunks`) by `run(ids, starts, rows)`, which
    returns the forward's cache and mask first (the engine's `_prefill_rows`)."""
    out: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in ids]
    for chunk in padding_chunks([len(p) - s.tokens for p, s in zip(ids, starts, strict=True)]):
        cache, mask = run(
            [ids[j] for j in chunk], [starts[j] for j in chunk], [rows[j] for j in chunk]
        )[:2]
        for row, j in enumerate(chunk):
            cols = mask[row].nonzero().squeeze(1)
            out[j] = [
                (x.keys[row : row + 1, :, cols], x.values[row : row + 1, :, cols])
                for x in cache.layers
            ]
    return out


def start_after(hit: PrefixHit, skip: int, block_size: int) -> PrefillStart:
    """A row's start from its prompt's prefix-cache `hit` when its first `skip` tokens are
    the batch's head (`engine/batch_head.py`, whole blocks): what the hit holds past them."""
    if hit.tokens <= skip:
        return PrefillStart(0)
    return PrefillStart(
        hit.tokens - skip, hit=PrefixHit(hit.tokens - skip, hit.blocks[skip // block_size :])
    )


def fill_starts(
    cache: Any,
    starts: list[PrefillStart],
    width: int,
    suffix: int,
    block_size: int,
    device: torch.device,
) -> None:
    """Give each layer of `cache` a (B, H, width + room, D) buffer whose first `width`
    steps hold each row's start, right-aligned (zeros before it); prefix-cache blocks hold
    `block_size` steps each."""
    b = len(starts)
    st0 = next(s for s in starts if s.head is not None or (s.hit is not None and s.hit.blocks))
    if st0.head is not None:
        some = st0.head[0][0]  # (1, H, P, D)
        h, d, dtype = some.shape[1], some.shape[-1], some.dtype
    else:
        assert st0.hit is not None
        some = st0.hit.blocks[0].kv  # (L, 2, H, bs, D)
        h, d, dtype = some.shape[2], some.shape[-1], some.dtype
    room = suffix + max(64, (width + suffix) // 4)
    bs = block_size
    layer: Any
    for li, layer in enumerate(cache.layers):
        # A prefix hit is gathered one layer at a time, never whole: stacking every row's
        # hit across all layers first held 620 MB for 30 rows of a 450-token hit.
        buf_k = torch.zeros((b, h, width + room, d), dtype=dtype, device=device)
        buf_v = torch.zeros_like(buf_k)
        for i, st in enumerate(starts):
            lo = width - st.tokens
            if st.head is not None:
                buf_k[i, :, lo:width] = st.head[li][0][0]
                buf_v[i, :, lo:width] = st.head[li][1][0]
            elif st.hit is not None and st.hit.blocks:
                # this layer of the hit's blocks, (k, 2, H, bs, D): one layer, one row
                kv = torch.stack([block.kv[li] for block in st.hit.blocks])
                k = kv.shape[0]
                buf_k[i, :, lo:width].view(h, k, bs, d).copy_(kv[:, 0].transpose(0, 1))
                buf_v[i, :, lo:width].view(h, k, bs, d).copy_(kv[:, 1].transpose(0, 1))
        preset_layer(layer, buf_k, buf_v, width)


def prefill_inputs(
    cache: Any,
    prompts: list[list[int]],
    starts: list[PrefillStart],
    pad: int,
    block_size: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prefill forward's inputs: every row's start laid into `cache` (`fill_starts`),
    then the (B, S) ids of each prompt's suffix after its start, left-padded; the (B, T)
    mask over starts and suffixes (`[pads | start | pads | suffix]`); the (B, S) positions,
    continuing each row's start."""
    b = len(prompts)
    width = max(s.tokens for s in starts)
    mask_start = torch.zeros((b, width), dtype=torch.long)
    suffix = max(len(p) - s.tokens for p, s in zip(prompts, starts, strict=True))
    if width:
        fill_starts(cache, starts, width, suffix, block_size, device)
        for i, st in enumerate(starts):
            mask_start[i, width - st.tokens :] = 1
    ids = torch.full((b, suffix), pad, dtype=torch.long)
    mask = torch.zeros((b, suffix), dtype=torch.long)
    for i, (p, st) in enumerate(zip(prompts, starts, strict=True)):
        n = len(p) - st.tokens
        ids[i, suffix - n :] = torch.tensor(p[st.tokens :])
        mask[i, suffix - n :] = 1
    ids, mask = ids.to(device), mask.to(device)
    offset = torch.tensor([s.tokens for s in starts], device=device)[:, None]
    pos = offset + (mask.cumsum(-1) - 1).clamp(min=0)  # (B, S)
    return ids, torch.cat([mask_start.to(device), mask], 1), pos
