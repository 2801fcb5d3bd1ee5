"""`GrowingLayer` against plain concatenation: the same keys and values after any sequence
of appends, row selections, left drops and merges, and no copy on a plain decode step;
squeezing out masked columns keeps each row's real keys in order and the model's outputs."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from art_langgraph.engine.kv_cache import (
    GrowingLayer,
    drop_left,
    growing_cache,
    merge_rows,
    squeeze_columns,
)
from art_langgraph.engine.torch_engine import TorchEngine


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


def test_squeeze_keeps_each_rows_real_columns_in_order() -> None:
    g = torch.Generator().manual_seed(1)
    cache = _cache(GrowingLayer)
    for layer in cache.layers:
        layer.update(*_kv(3, 10, g))
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 0, 1], [0] * 10])
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    new = squeeze_columns(cache, mask)
    assert new.tolist() == [[0, 0, 0] + [1] * 6, [1] * 9, [0] * 9]
    for (k, v), layer in zip(before, cache.layers, strict=True):
        for row in range(3):
            real, kept = mask[row].bool(), new[row].bool()
            assert torch.equal(layer.keys[row][:, kept], k[row][:, real])
            assert torch.equal(layer.values[row][:, kept], v[row][:, real])


def test_squeeze_leaves_the_next_tokens_logits_alone(engine: TorchEngine) -> None:
    """Two rows with masked columns between their tokens (as fast-forward leaves them):
    the next token's logits are the same before and after the squeeze."""
    model = engine.base_model
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 200, (2, 24), generator=g)
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[0, 5:9] = 0
    mask[1, :3] = 0
    mask[1, 15:20] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    def step(cache: DynamicCache, mask: torch.Tensor) -> torch.Tensor:
        nxt = torch.tensor([[7], [11]])
        t = cache.get_seq_length()
        out = model(
            input_ids=nxt,
            attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1),
            position_ids=pos[:, -1:] + 1,
            past_key_values=cache,
            cache_position=torch.arange(t, t + 1),
            use_cache=True,
        )
        return out.logits[:, -1]

    with torch.inference_mode():
        caches = []
        for _ in range(2):
            cache = growing_cache(model.config)
            model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache)
            caches.append(cache)
        want = step(caches[0], mask)
        squeezed = squeeze_columns(caches[1], mask)
        assert squeezed.shape[1] == 20  # the longer row: 24 columns, 4 masked
        got = step(caches[1], squeezed)
    assert torch.allclose(got, want, atol=1e-4)
