"""Grammar plumbing: the bitmask unpacking agrees with llguidance's own application."""

from __future__ import annotations

import llguidance.torch
import pytest
import torch

from art_langgraph.engine.constrained import unpack_bitmask
from art_langgraph.engine.torch_engine import TorchEngine
from art_langgraph.errors import UsageError


def test_unpack_bitmask_matches_llguidance() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 2000
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (3, (vocab + 31) // 32), dtype=torch.int32, generator=gen
    )
    logits = torch.randn(3, vocab, generator=gen)
    want = logits.clone()
    llguidance.torch.apply_token_bitmask_inplace(want, bitmask)
    got = logits.masked_fill(~unpack_bitmask(bitmask, vocab), float("-inf"))
    assert torch.equal(got, want)


def test_bad_constraints_are_usage_errors(engine: TorchEngine) -> None:
    with pytest.raises(UsageError):
        engine.grammars.structured({"grammar": "start: ???"})
    with pytest.raises(UsageError):
        engine.grammars.structured({"choice": []})
    with pytest.raises(UsageError):
        engine.grammars.tool_calls([])
    assert engine.grammars.structured({"choice": ["yes", "no"]})
    assert engine.grammars.structured({"regex": "[a-z]{3}"})
