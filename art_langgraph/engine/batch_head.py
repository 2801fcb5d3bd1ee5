"""The batch head: the prompt head every row of the running batch shares, its KV held once.

An agent batch's rows all open with the same system prompt and tool schemas (~700 of the
~850-900 tokens of a bundled task's turn). Held in every row, that head's keys and values
are read again for every row at every decode step and counted again for every row
against the running-KV budget (`TorchEngineConfig.max_kv_bytes`). `BatchHead` holds them
once, (1, kv heads, P, dim) per layer; each row's cache holds only what follows.

`head_attention` is the attention of a forward over such a batch (registered with
transformers as HEAD_ATTENTION; without the `batch_head` keyword it is SDPA as
transformers runs it). On a CPU it runs in two parts, each torch's CPU flash kernel, merged
by their log-sum-exps: the head's, with every row's queries of a key/value head stacked
into one long query, so the head is read once for the batch (and never copied into a
row); and the row's own keys under its mask (converted once a forward). On other devices
it puts the head before each row's keys and runs SDPA (the budget still counts the head
once).

`head_length` picks a head for rows about to form a batch (their longest common prefix,
whole prefix-cache blocks, leaving each row a token of its own), `covers` says whether a
row may join a batch with a head, and `dissolve` copies the head back into every row
(a row that does not share it is about to join).

Left out: several heads in one batch (rows of another head wait, or dissolve this one),
sliding-window layers (the engine keeps the head off for models that have them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from art_langgraph.engine.kv_cache import GrowingLayer

if TYPE_CHECKING:
    from art_langgraph.engine.prefill import PrefillStart
    from art_langgraph.engine.prefix_cache import PrefixCache
    from art_langgraph.engine.request import Request

log = logging.getLogger(__name__)

HEAD_ATTENTION = "art_batch_head"
"""The name under which `head_attention` is registered with transformers."""
MIN_HEAD_TOKENS = 128
"""A shorter common prefix is left in the rows: holding it apart saves too little."""


@dataclass
class BatchHead:
    """The prompt head the batch's rows share, and its KV."""

    ids: tuple[int, ...]
    """Its tokens: the first `len(ids)` of every row's prompt."""
    identity: str
    """The weights identity its KV was computed under (every row's)."""
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    """Per layer, (keys, values), each (1, kv heads, P, head dim)."""
    _mask: tuple[Any, tuple[int, int, int], Any, Any] | None = field(default=None, repr=False)
    """The last forward's mask, converted (`own_mask`)."""

    @property
    def length(self) -> int:
        return len(self.ids)

    def own_mask(
        self, mask: torch.Tensor | None, b: int, q: int, s: int, dtype: Any, device: Any
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The rows' own-key mask as the CPU flash kernel takes it ((b, 1, q, s) additive,
        or None), and where a query sees none of its row's keys ((b, 1, q) or None):
        converted once a forward (every layer gets the same mask object) and kept until the
        next one."""
        if self._mask is not None and self._mask[0] is mask and self._mask[1] == (b, q, s):
            return self._mask[2], self._mask[3]
        out = blind = None
        if mask is None and q > 1:
            mask = torch.ones(q, s, dtype=torch.bool, device=device).tril(s - q)[None, None]
        if mask is not None:
            if mask.dtype == torch.bool:
                keep = mask[..., -q:, -s:]
                out = torch.zeros(keep.shape, dtype=dtype, device=device)
                out = out.masked_fill(~keep, float("-inf")).expand(b, 1, q, s)
                blind = ~keep.any(-1)
            else:
                out = mask[..., -q:, -s:].to(dtype).expand(b, 1, q, s)
                blind = (out == float("-inf")).all(-1)
            blind = blind if bool(blind.any()) else None
        self._mask = (mask, (b, q, s), out, blind)
        return out, blind

    def covers(self, prompt: Sequence[int], identity: str) -> bool:
        """Whether a row of `prompt` under `identity` can join: it opens with the head and
        has a token after it."""
        n = len(self.ids)
        return identity == self.identity and len(prompt) > n and tuple(prompt[:n]) == self.ids


def head_length(prompts: Sequence[Sequence[int]], block_size: int) -> int:
    """The head rows of `prompts` would share: their longest common prefix, cut to whole
    `block_size` blocks (the prefix cache's, so the head's KV can come from it and go
    into it) and short of every prompt's last token; 0 when under MIN_HEAD_TOKENS."""
    if not prompts:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = min(n, next((k for k in range(n) if p[k] != first[k]), n))
    n -= n % block_size
    return n if n >= MIN_HEAD_TOKENS else 0


def form_head(
    rows: Sequence[Request],
    prefix: PrefixCache,
    prefill: Callable[[list[int], PrefillStart, Request], tuple[Any, torch.Tensor, Any, Any]],
) -> BatchHead | None:
    """The head `rows` forming a batch share (`head_length`), its KV from the prefix cache
    or from `prefill` (one row: its cache and mask); None where they share none worth
    holding apart, are fewer than two, or run under several weights."""
    from art_langgraph.engine.prefill import PrefillStart

    if len(rows) < 2 or len({r.identity for r in rows}) > 1:
        return None
    n = head_length([r.prompt_ids for r in rows], prefix.block_size)
    if not n:
        return None
    first = rows[0]
    ids = first.prompt_ids[:n]
    hit = prefix.lookup(first.identity, ids, n)
    if hit.tokens == n:  # (L, 2, H, bs, D) blocks -> per layer (1, H, n, D)
        kv = torch.cat([b.kv for b in hit.blocks], dim=3)
        layers = [(kv[i, 0][None], kv[i, 1][None]) for i in range(kv.shape[0])]
    else:
        cache, mask, _, _ = prefill(ids, PrefillStart(hit.tokens, hit=hit), first)
        cols = mask[0].nonzero().squeeze(1)
        layers = [(x.keys[:, :, cols], x.values[:, :, cols]) for x in cache.layers]
    return BatchHead(tuple(ids), first.identity, layers)


class SharedCount:
    """While admission takes rows: how many tokens of each the batch will hold once (its
    head's, or the head the rows forming a batch will share), for the KV budget."""

    def __init__(self, head: BatchHead | None, *, forming: bool, block_size: int) -> None:
        self.head = head
        self.forming = forming
        self.block_size = block_size
        self.first: Sequence[int] | None = None
        self.key: str | None = None
        self.common = 0  # the forming rows' common prefix so far
        self.pending = 0  # ... with the row `_after` last looked at
        self.broken = False  # a row that does not open with the head: it dissolves

    def _after(self, prompt: Sequence[int], key: str) -> tuple[int, bool]:
        """(the count with this row too, whether it keeps a head possible)."""
        if self.broken:
            return 0, False
        if self.head is not None:
            n = self.head.length
            return (
                (n, True) if len(prompt) > n and tuple(prompt[:n]) == self.head.ids else (0, False)
            )
        if not self.forming:
            return 0, False
        if self.first is None:
            return 0, True  # one row alone forms no head
        if key != self.key:
            return 0, False
        m = min(self.common, len(prompt) - 1)
        m = next((k for k in range(m) if prompt[k] != self.first[k]), m)
        self.pending = m
        cut = m - m % self.block_size
        return (cut if cut >= MIN_HEAD_TOKENS else 0), True

    def with_row(self, prompt: Sequence[int], key: str) -> int:
        """The tokens held once if the row of `prompt` (under peft key `key`) joins too."""
        return self._after(prompt, key)[0]

    def add(self, prompt: Sequence[int], key: str) -> None:
        """The row of `prompt` joins."""
        if self.forming and self.head is None and self.first is None:
            self.first, self.key, self.common = prompt, key, len(prompt) - 1
            return
        _, ok = self._after(prompt, key)
        if not ok:
            self.broken = True
        elif self.head is None and self.forming:
            self.common = self.pending


def head_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    batch_head: BatchHead | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over the batch head (`batch_head`, its layer `module.layer_idx`) and each
    row's own keys (`key`/`value`, (B, kv heads, S, D), masked by `attention_mask`: a
    (B, 1, q, S) boolean where True attends, or None for causal). Returns (B, q, heads, D)."""
    if batch_head is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    hk, hv = batch_head.layers[module.layer_idx]
    b, hq, q, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else d**-0.5
    if query.device.type != "cpu":
        return _concat_attention(query, key, value, attention_mask, hk, hv, scale)
    # torch's CPU flash kernel: grouped-query heads, a float mask, and the log-sum-exp
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    g = hq // hkv
    # the head: every row's queries of one key/value head as one long query
    stacked = query.reshape(b, hkv, g * q, d).transpose(0, 1).reshape(1, hkv, b * g * q, d)
    o_head, l_head = flash(stacked, hk, hv, 0.0, False, scale=scale)
    o_head = o_head.reshape(hkv, b, g * q, d).transpose(0, 1).reshape(b, hq, q, d)
    l_head = l_head.reshape(hkv, b, g * q).transpose(0, 1).reshape(b, hq, q)
    # the row's own keys, under its mask (causal over its new tokens when none is given)
    mask, blind = batch_head.own_mask(attention_mask, b, q, s, query.dtype, query.device)
    o_own, l_own = flash(query, key, value, 0.0, False, attn_mask=mask, scale=scale)
    if blind is not None:  # a query that sees none of its row's keys (a pad): the head alone
        l_own = l_own.masked_fill(blind, float("-inf"))
    # softmax over both parts: each part's output weighed by its share of the exp-sum
    share = torch.sigmoid(l_head - l_own).unsqueeze(-1)
    out = o_own + (o_head - o_own) * share
    return out.transpose(1, 2).contiguous(), None


def _concat_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    hk: torch.Tensor,
    hv: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, None]:
    """Off the CPU: the head put before each row's keys, one SDPA call."""
    b, hq, q, _ = query.shape
    s, p = key.shape[2], hk.shape[2]
    k = torch.cat([hk.expand(b, -1, -1, -1), key], 2)
    v = torch.cat([hv.expand(b, -1, -1, -1), value], 2)
    if attention_mask is None:
        own = torch.ones(q, s, dtype=torch.bool, device=query.device).tril(s - q)
        mask = F.pad(own, (p, 0), value=True)[None, None]
    elif attention_mask.dtype == torch.bool:
        mask = F.pad(attention_mask[..., -s:], (p, 0), value=True)
    else:
        mask = F.pad(attention_mask[..., -s:], (p, 0), value=0.0)
    gqa = hq != key.shape[1]
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


def register_head_attention() -> str:
    """Register `head_attention` (and SDPA's mask builder for it) with transformers
    (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(HEAD_ATTENTION, head_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(HEAD_ATTENTION, sdpa_mask)
    return HEAD_ATTENTION


def set_engine_attention(model: Any, head: bool) -> bool:
    """Give the engine's `model` `head_attention` when `head` (SDPA still for forwards
    without a head); an architecture that cannot take it keeps its own. Returns whether
    the batch head is on."""
    if not head:
        return False
    try:
        model.set_attn_implementation(register_head_attention())
        return True
    except (ValueError, AttributeError) as exc:  # an architecture without it
        log.info("batch head off: %s", exc)
        return False


def dissolve(cache: Any, head: BatchHead) -> None:
    """Put the head's KV back before every row's own in `cache` (one copy of every row):
    the batch goes on without a head."""
    from art_langgraph.engine.kv_cache import _MIN_ROOM

    layer: Any
    for layer, (hk, hv) in zip(cache.layers, head.layers, strict=True):
        k, v = layer.keys, layer.values
        b, h, t, d = k.shape
        p = hk.shape[2]
        room = max(_MIN_ROOM, (p + t) // 4)
        buf_k = k.new_empty((b, h, p + t + room, d))
        buf_v = v.new_empty((b, h, p + t + room, d))
        buf_k[:, :, :p], buf_v[:, :, :p] = hk, hv
        buf_k[:, :, p : p + t], buf_v[:, :, p : p + t] = k, v
        if isinstance(layer, GrowingLayer):
            layer._buf_k, layer._buf_v = buf_k, buf_v
            layer._view(p + t)
        else:
            layer.keys, layer.values = buf_k[:, :, : p + t], buf_v[:, :, : p + t]
        del k, v
