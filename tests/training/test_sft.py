"""The warm start's stopping rule and metrics (`art_langgraph.training.sft`), by hand."""

from __future__ import annotations

import pytest

from art_langgraph.training.sft import sft_metrics, tail_loss


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
