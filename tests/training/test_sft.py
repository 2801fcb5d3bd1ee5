"""The warm start's stopping rule and metrics (`art_langgraph.training.sft`), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from art_langgraph.training.sft import sft_metrics, sure_sequences, tail_loss, tail_share


def test_the_tail_is_the_last_quarter_of_batches_and_at_least_one() -> None:
    assert tail_loss([4.0, 3.0, 2.0, 1.0, 0.5, 0.3, 0.2, 0.1]) == pytest.approx(0.15)
    assert tail_loss([0.9, 0.5, 0.2]) == 0.2  # three batches: the last alone
    assert tail_loss([0.7]) == 0.7


def test_the_metrics_give_each_epoch_and_the_whole() -> None:
    m = sft_metrics([[0.8, 0.4, 0.2, 0.1], [0.1, 0.05, 0.02, 0.01]], 12.5)
    assert m["sft_loss_first"] == 0.8 and m["sft_loss_last"] == 0.01
    assert m["sft_steps"] == 8 and m["sft_epochs"] == 2 and m["sft_seconds"] == 12.5
    assert m["sft_epoch1_loss"] == pytest.approx(0.375) and m["sft_epoch1_tail_loss"] == 0.1
    assert m["sft_epoch2_loss"] == pytest.approx(0.045) and m["sft_epoch2_tail_loss"] == 0.01


def test_a_sequence_is_sure_only_when_its_least_likely_token_is_over_one_half() -> None:
    lp = torch.log(torch.tensor([0.9, 0.99, 0.6, 0.9, 0.4, 0.95, 0.8]))
    ids = torch.tensor([3, 3, 3, 5, 5, 0, 0])  # the ids of a micro-batch, in any order
    assert sure_sequences(lp, ids) == 2.0  # sequence 5 has one token at 0.4
    assert sure_sequences(lp[:0], ids[:0]) == 0.0
    assert sure_sequences(torch.tensor([math.log(0.5)]), torch.tensor([0])) == 0.0  # a tie is doubt


def test_the_tail_share_of_sure_sequences_is_over_the_last_quarter_of_batches() -> None:
    counts = [(0.0, 8), (2.0, 8), (4.0, 8), (6.0, 8), (8.0, 8), (5.0, 8), (7.0, 8), (3.0, 4)]
    assert tail_share(counts) == pytest.approx(10 / 12)
    m = sft_metrics([[0.5] * 8], 1.0, [counts])
    assert m["sft_epoch1_tail_sure"] == pytest.approx(10 / 12)
    assert "sft_epoch1_tail_sure" not in sft_metrics([[0.5] * 8], 1.0)
