"""What a LocalBackend runs: the choices are checked when made, and the backend's shorthand
keywords land in them."""

from __future__ import annotations

from pathlib import Path

import pytest

import art_langgraph as art


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: art.EngineChoice("gpu"), "engine must be 'auto', 'torch' or 'vllm'"),  # type: ignore[arg-type]
        (lambda: art.EngineChoice(replicas=0), "replicas must be an integer >= 1"),
        (lambda: art.EngineChoice(max_loaded_adapters=0), "max_loaded_adapters must be"),
        (lambda: art.EngineChoice("vllm", ray_address="local"), "not placed on Ray"),
        (lambda: art.TrainerChoice(ranks=0), "trainer_ranks must be an integer >= 1"),
    ],
)
def test_a_choice_that_cannot_be_run_is_refused_when_made(make: object, match: str) -> None:
    with pytest.raises(art.UsageError, match=match):
        make()  # type: ignore[operator]


def test_the_shorthand_keywords_fill_the_choices(tmp_path: Path) -> None:
    backend = art.LocalBackend(
        tmp_path,
        engine=art.EngineChoice("torch", device="cpu", max_loaded_adapters=2),
        replicas=2,
        ray="local",
        trainer_ranks=3,
        server=art.ServerChoice(port=8123, http=False),
    )
    assert backend.engine_choice == art.EngineChoice(
        "torch", replicas=2, ray_address="local", device="cpu", max_loaded_adapters=2
    )
    assert backend.trainer_choice == art.TrainerChoice(ranks=3)
    assert backend.server_choice.port == 8123 and not backend.server_choice.http
    assert backend.engine is None  # nothing starts before a model registers
    backend.close_sync()


def test_the_defaults_are_one_engine_one_trainer_and_a_loopback_server(tmp_path: Path) -> None:
    backend = art.LocalBackend(tmp_path)
    assert backend.engine_choice == art.EngineChoice()
    assert backend.trainer_choice == art.TrainerChoice()
    assert backend.server_choice == art.ServerChoice(host="127.0.0.1", port=0, api_key=None)
    backend.close_sync()
