"""The engine's KV cache: transformers' `DynamicCache` with layers that grow in place.

transformers' `DynamicLayer.update` concatenates each new token's keys and values onto
the whole cache, so every decode step copies every layer's cache: for 36 rows of 900
tokens on SmolLM2-135M that is 1.5 GB of copies per step, and 30 freed blocks of ~25 MB
per step for the allocator to fragment. `GrowingLayer` keeps keys and values in buffers
with spare room along time; a step writes its column in place and returns a view. The
buffer is reallocated only when it is full (with a quarter more room) or when the
engine reshapes the batch (rows admitted, rows retired).

`growing_cache(config)` builds a `DynamicCache` whose full-attention layers are
`GrowingLayer`s; `merge_rows`, `fill_rows` (new rows into free slots, in place) and
`drop_left` are the batch reshapes the engine needs, and
`preset_layer` starts a layer from KV computed earlier (`engine/prefix_cache.py`).

Left out: sliding-window layers (kept as transformers builds them) and paged memory.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

_MIN_ROOM = 64
"""Spare time steps a (re)allocated buffer gets at least."""


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys/values are views `[:, :, :T]` of larger buffers."""

    keys: Any
    values: Any
    _buf_k: Any = None
    _buf_v: Any = None

    def _adopt(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        """Copy `keys`/`values` (B, H, T, D) into fresh buffers with `room` spare steps."""
        b, h, t, d = keys.shape
        self._buf_k = keys.new_empty((b, h, t + room, d))
        self._buf_v = values.new_empty((b, h, t + room, d))
        self._buf_k[:, :, :t] = keys
        self._buf_v[:, :, :t] = values
        self._view(t)

    def _view(self, t: int) -> None:
        assert self._buf_k is not None and self._buf_v is not None
        self.keys = self._buf_k[:, :, :t]
        self.values = self._buf_v[:, :, :t]

    def _owns(self) -> bool:
        """Whether `keys` is still the view of our buffer (nobody replaced it)."""
        return (
            self._buf_k is not None
            and self.keys.dim() == 4
            and self.keys.data_ptr() == self._buf_k.data_ptr()
            and self.keys.shape[0] == self._buf_k.shape[0]
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        if self.keys.dim() != 4 or self.keys.numel() == 0:
            self._adopt(key_states, value_states, max(_MIN_ROOM, q // 4))
            return self.keys, self.values
        t = self.keys.shape[-2]
        if not self._owns() or t + q > self._buf_k.shape[-2]:
            self._adopt(self.keys, self.values, q + max(_MIN_ROOM, (t + q) // 4))
        assert self._buf_k is not None and self._buf_v is not None
        self._buf_k[:, :, t : t + q] = key_states
        self._buf_v[:, :, t : t + q] = value_states
        self._view(t + q)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() == 0:
            return
        t = self.keys.shape[-2]
        if self._owns():
            assert self._buf_k is not None and self._buf_v is not None
            self._buf_k, self._buf_v = self._buf_k[indices], self._buf_v[indices]
            self._view(t)
        else:
            super().batch_select_indices(indices)

    def reset(self) -> None:
        self._buf_k = self._buf_v = None
        super().reset()


def growing_cache(config: Any) -> DynamicCache:
    """A `DynamicCache` for `config` whose full-attention layers grow in place."""
    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer.__class__ = GrowingLayer
    return cache


def drop_left(cache: DynamicCache, lead: int) -> None:
    """Drop the first `lead` time steps of every layer (columns no row uses): a view of the
    same buffers, no copy."""
    layer: Any
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer) and layer._owns():
            assert layer._buf_k is not None and layer._buf_v is not None
            t = layer.keys.shape[-2]
            layer._buf_k, layer._buf_v = layer._buf_k[:, :, lead:], layer._buf_v[:, :, lead:]
            layer._view(t - lead)
        else:
            layer.keys = layer.keys[:, :, lead:]
            layer.values = layer.values[:, :, lead:]


def merge_rows(old: DynamicCache, new: DynamicCache, width: int) -> None:
    """Append `new`'s rows to `old`'s, both left-padded (with zeros) to `width` steps, into
    buffers with spare room: the one copy a merge needs. `new` is emptied layer by layer as
    it is copied (its caller is done with it), so a merge holds at most one layer twice."""
    old_l: Any
    new_l: Any
    for old_l, new_l in zip(old.layers, new.layers, strict=True):
        ok, ov, nk, nv = old_l.keys, old_l.values, new_l.keys, new_l.values
        b_old, b_new = ok.shape[0], nk.shape[0]
        h, d = ok.shape[1], ok.shape[3]
        room = max(_MIN_ROOM, width // 4)
        buf_k = ok.new_zeros((b_old + b_new, h, width + room, d))
        buf_v = ov.new_zeros((b_old + b_new, h, width + room, d))
        for rows, k, v in ((slice(0, b_old), ok, ov), (slice(b_old, None), nk, nv)):
            t = k.shape[-2]
            buf_k[rows, :, width - t : width] = k
            buf_v[rows, :, width - t : width] = v
        if isinstance(old_l, GrowingLayer):
            old_l._buf_k, old_l._buf_v = buf_k, buf_v
            old_l._view(width)
        else:
            old_l.keys, old_l.values = buf_k[:, :, :width], buf_v[:, :, :width]
        del ok, ov, nk, nv, k, v
        new_l.reset()  # frees this layer of `new` now, not after the whole merge


def squeeze_columns(cache: DynamicCache, mask: torch.Tensor) -> torch.Tensor:
    """Rebuild every layer with each row's real columns (where `mask` (B, T) is 1) only,
    right-aligned, into buffers as wide as the longest row (with spare room): the masked
    columns between a row's tokens (a fast-forward step's pads, the stale columns of a
    slot filled in place) go. Keys keep the positions they were computed at, and attention
    does not depend on where a column sits, so the outputs are the same. Returns the new
    (B, width) mask."""
    lengths = mask.sum(-1)  # (B,)
    width = int(lengths.max())
    rows, cols = mask.nonzero(as_tuple=True)  # each real column, row by row, in order
    starts = (width - lengths).repeat_interleave(lengths)  # each row's first new column
    order = torch.arange(len(rows), device=mask.device) - (
        lengths.cumsum(0) - lengths
    ).repeat_interleave(lengths)
    dest = starts + order
    layer: Any
    for layer in cache.layers:
        k, v = layer.keys, layer.values
        b, h, _, d = k.shape
        room = max(_MIN_ROOM, width // 4)
        buf_k = k.new_zeros((b, h, width + room, d))
        buf_v = v.new_zeros((b, h, width + room, d))
        buf_k[rows, :, dest] = k[rows, :, cols]
        buf_v[rows, :, dest] = v[rows, :, cols]
        if isinstance(layer, GrowingLayer):
            layer._buf_k, layer._buf_v = buf_k, buf_v
            layer._view(width)
        else:
            layer.keys, layer.values = buf_k[:, :, :width], buf_v[:, :, :width]
        del k, v
    new = torch.zeros((mask.shape[0], width), dtype=mask.dtype, device=mask.device)
    new[rows, dest] = 1
    return new


def fill_rows(old: DynamicCache, new: DynamicCache, slots: list[int], width: int) -> bool:
    """Write `new`'s rows into rows `slots[:len(new rows)]` of `old`, right-aligned at
    `width` (the batch's current length): admitting rows into free slots copies only the
    new rows. The slots' earlier columns keep stale values the mask hides. Returns False,
    writing nothing, where a layer is not a `GrowingLayer` owning its buffer."""
    pairs: list[tuple[Any, Any]] = list(zip(old.layers, new.layers, strict=True))
    if not all(isinstance(o, GrowingLayer) and o._owns() for o, _ in pairs):
        return False
    for old_l, new_l in pairs:
        if old_l.keys.shape[-2] != width or new_l.keys.shape[-2] > width:
            return False
    first: Any = new.layers[0]
    b = first.keys.shape[0]
    idx = torch.tensor(slots[:b], device=first.keys.device)
    for old_l, new_l in pairs:
        t = new_l.keys.shape[-2]
        old_l._buf_k[idx, :, width - t : width] = new_l.keys
        old_l._buf_v[idx, :, width - t : width] = new_l.values
    return True


def preset_layer(layer: GrowingLayer, buf_k: torch.Tensor, buf_v: torch.Tensor, t: int) -> None:
    """Make `layer` hold the first `t` steps of the buffers `buf_k`/`buf_v` (B, H, T, D):
    a batch that starts from KV computed earlier (the engine's prefix cache)."""
    layer.lazy_initialization(buf_k, buf_v)
    layer._buf_k, layer._buf_v = buf_k, buf_v
    layer._view(t)


def cache_keyword(model: Any) -> str:
    """The forward keyword that takes the KV cache: `cache` since transformers 5.24,
    `past_key_values` before (5.24 still takes it, with a deprecation warning per call)."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"
