"""`engine/packed_linear.py`: packed layers compute what `F.linear` computes (to float32
rounding), fall back where they must, and never serve a weight older than the last pack."""

from __future__ import annotations

import copy

import pytest
import torch

from art_langgraph.engine.packed_linear import (
    PACKED_ROWS,
    PackedLinear,
    can_pack,
    pack_linears,
    packed_weight,
)

pytestmark = pytest.mark.skipif(
    not can_pack(torch.device("cpu"), torch.float32), reason="no oneDNN in this torch build"
)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 32, bias=False)
    )


def test_packed_matches_linear_and_keeps_shapes() -> None:
    net = _net()
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        want = net(x)
        assert pack_linears(net) == 2
        assert all(type(m) is PackedLinear for m in (net[0], net[2]))
        got = net(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # a non-contiguous input (a decode step's slice)
        xs = torch.randn(5, 3, 64).transpose(0, 1)
        torch.testing.assert_close(net(xs), net(xs.contiguous()), rtol=0, atol=0)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, PACKED_ROWS, PACKED_ROWS + 1, 3 * PACKED_ROWS + 7])
def test_any_row_count_matches_linear_packed_or_packed_only(rows: int) -> None:
    """Rows rounded up to a bucket (past PACKED_ROWS, one of eight an octave), whether the
    layer holds its own weight or only a packed copy (the merged copy's): the same product
    at every row count."""
    net = _net()
    x = torch.randn(rows, 64)
    with torch.no_grad():
        want = net(x)
        pack_linears(net)
        torch.testing.assert_close(net(x), want, rtol=1e-5, atol=1e-5)
        only = copy.deepcopy(net)
        only[0].set_packed(packed_weight(net[0].weight))
        only[0].weight.data.zero_()  # a packed-only layer never reads its weight
        torch.testing.assert_close(only(x), want, rtol=1e-5, atol=1e-5)


def test_packed_row_counts_are_few_and_waste_at_most_an_eighth() -> None:
    from art_langgraph.engine.packed_linear import bucket_rows

    counts = {bucket_rows(m) for m in range(1, 8193)}
    # 1, 2 and 4 rows (one agent's decode step: its own count, not 8), multiples of 8 up to
    # PACKED_ROWS, then eight an octave to 8192
    assert len(counts) <= 3 + 8 + 8 * 7
    assert [bucket_rows(m) for m in range(10)] == [0, 1, 2, 4, 4, 8, 8, 8, 8, 16]
    assert all(m <= bucket_rows(m) <= m + max(7, m // 8) for m in range(1, 8193))


def test_gradients_and_other_dtypes_fall_back_to_linear() -> None:
    net = _net()
    pack_linears(net)
    x = torch.randn(4, 64, requires_grad=True)
    net(x).sum().backward()
    assert x.grad is not None and net[0].weight.grad is not None
    with torch.no_grad():
        y = net.double()(torch.randn(2, 64, dtype=torch.float64))  # not the packed dtype
    assert y.dtype == torch.float64


def test_a_repack_serves_the_new_weight_and_copies_start_unpacked() -> None:
    net = _net()
    pack_linears(net)
    x = torch.randn(2, 64)
    with torch.no_grad():
        net[0].weight.mul_(2)
        pack_linears(net)  # the engine repacks after writing weights (its merged copy)
        want = torch.nn.functional.linear(x, net[0].weight, net[0].bias)
        torch.testing.assert_close(net[0](x), want, rtol=1e-5, atol=1e-5)
        twin = copy.deepcopy(net)
        assert twin[0]._packed is None  # oneDNN tensors do not copy; the copy repacks
        torch.testing.assert_close(twin[0](x), want, rtol=1e-5, atol=1e-5)


def test_lora_factors_are_not_packed() -> None:
    from peft import LoraConfig, get_peft_model

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x)

    model = get_peft_model(Tiny(), LoraConfig(r=4, target_modules=["proj"]))
    assert pack_linears(model) == 1
    packed = [n for n, m in model.named_modules() if type(m) is PackedLinear]
    assert packed == ["base_model.model.proj.base_layer"]
