"""`GrowingLayer` against plain concatenation: the same keys and values after any sequence
of appends, row selections, left drops and merges, and no copy on a plain decode step."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from art_langgraph.engine.kv_cache import GrowingLayer, drop_left, merge_rows


def _cache(layer_cls: type) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [layer_cls(), layer_cls()]
    return cache


def _kv(b: int, t: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(b, 2, t, 4, generator=g), torch.randn(b, 2, t, 4, generator=g)


def _same(a: DynamicCache, b: DynamicCache) -> None:
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_growing_layers_match_concatenation_through_every_batch_reshape() -> None:
    g = torch.Generator().manual_seed(0)
    ours, ref = _cache(GrowingLayer), _cache(DynamicLayer)

    def append(b: int, t: int) -> None:
        for i in range(2):
            k, v = _kv(b, t, g)
            ours.layers[i].update(k, v)
            ref.layers[i].update(k, v)

    append(3, 20)  # prefill
    for _ in range(150):  # decode past the first buffer's room
        append(3, 1)
    _same(ours, ref)
    idx = torch.tensor([0, 2])
    ours.batch_select_indices(idx)
    for layer in ref.layers:
        layer.keys, layer.values = layer.keys[idx], layer.values[idx]
    append(2, 1)
    _same(ours, ref)
    drop_left(ours, 5)
    for layer in ref.layers:
        layer.keys, layer.values = layer.keys[:, :, 5:], layer.values[:, :, 5:]
    append(2, 1)
    _same(ours, ref)
    new_ours, new_ref = _cache(GrowingLayer), _cache(DynamicLayer)
    for i in range(2):
        k, v = _kv(4, 30, g)
        new_ours.layers[i].update(k, v)
        new_ref.layers[i].update(k, v)
    width = max(ref.layers[0].keys.shape[-2], 30)
    merge_rows(ours, new_ours, width)
    for old_l, new_l in zip(ref.layers, new_ref.layers, strict=True):
        pad = lambda x: torch.nn.functional.pad(x, (0, 0, width - x.shape[-2], 0))  # noqa: E731
        old_l.keys = torch.cat([pad(old_l.keys), pad(new_l.keys)])
        old_l.values = torch.cat([pad(old_l.values), pad(new_l.values)])
    append(6, 1)
    _same(ours, ref)


def test_a_decode_step_writes_in_place() -> None:
    g = torch.Generator().manual_seed(1)
    layer = GrowingLayer()
    layer.update(*_kv(2, 10, g))
    before = layer.keys.data_ptr()
    for _ in range(20):
        layer.update(*_kv(2, 1, g))
        assert layer.keys.data_ptr() == before  # a view of the same buffer, nothing copied
    assert layer.keys.shape == (2, 2, 30, 4)
