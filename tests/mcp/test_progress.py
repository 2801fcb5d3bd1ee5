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
