"""The harness's log lines (`art_mcp.progress`) from a backend's metrics."""

from __future__ import annotations

from art_langgraph.training.sft import sft_metrics
from art_mcp.progress import warm_start_line


def test_the_warm_start_line_says_when_it_stopped_early() -> None:
    stopped = warm_start_line(16, 3, sft_metrics([[0.6, 0.3], [0.05, 0.01]], 41.6))
    assert stopped == (
        "SFT warm start on 16 demonstrations: 2 of 3 epochs in 42 s (stopped at loss 0.01), "
        "loss 0.60 -> 0.01; epochs' tail losses 0.30, 0.01"
    )
    every = warm_start_line(16, 1, sft_metrics([[0.6, 0.3]], 20.0))
    assert every.startswith("SFT warm start on 16 demonstrations: 1 of 1 epochs in 20 s, loss")


def test_the_warm_start_line_gives_each_epochs_share_of_sure_demonstrations() -> None:
    counts = [[(1.0, 4), (2.0, 4)], [(3.0, 4), (4.0, 4)]]
    line = warm_start_line(8, 2, sft_metrics([[0.6, 0.3], [0.05, 0.01]], 41.6, counts))
    assert line.endswith("tail demonstrations with no token in doubt (p > 0.5) 0.50, 1.00")


def test_an_epoch_s_line_names_the_epoch_of_the_warm_start() -> None:
    line = warm_start_line(
        120, 3, sft_metrics([[0.2, 0.01]], 99.6, [[(3.0, 4), (4.0, 4)]]), epoch=2
    )
    assert line == (
        "SFT warm start on 120 demonstrations: epoch 2 of 3 in 100 s, loss 0.20 -> 0.01; "
        "tail loss 0.01; tail demonstrations with no token in doubt (p > 0.5) 1.00"
    )
