"""The activation budget's arithmetic (`art_langgraph.training.activations`), by hand."""

from __future__ import annotations

from types import SimpleNamespace

from art_langgraph.training import activations as A


def test_a_layer_and_token_keep_about_12_hidden_and_5_inner_values() -> None:
    config = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)
    assert A.activation_bytes_per_token(config, 4) == 30 * (12 * 576 + 5 * 1536) * 4
    assert A.activation_bytes_per_token(config, 2) * 2 == A.activation_bytes_per_token(config, 4)


def test_just_enough_layers_recompute_to_fit_the_budget() -> None:
    # 10 layers of 100 bytes a token, 10 of them kept by a recomputed layer: 1,000 tokens
    assert A.layers_to_recompute(1000, 10, 1000, 10, budget=10**6) == [False] * 10
    some = A.layers_to_recompute(1000, 10, 1000, 10, budget=10**6 - 150_000)
    assert some == [True, True] + [False] * 8  # 90,000 saved a layer: two
    assert all(A.layers_to_recompute(1000, 10, 1000, 10, budget=0))


def test_the_token_caps_follow_the_budget() -> None:
    assert A.alone_tokens(10_000, 100) == 100
    assert A.alone_tokens(10, 100) == 1  # at least one token
    # a tree keeps every layer's input (10 layers x 8 bytes) and one layer's activations
    assert A.tree_tokens(10_000, 10, 200, 8) == 10_000 // (80 + 20)
