"""The Backend contract: `LocalBackend` satisfies it, and a `Model` needs nothing else.

`Delegating` forwards exactly the protocol's methods to a real LocalBackend (and has no
other attribute): a model trained through it proves that `Model` calls only the
protocol, which is what lets another backend (a remote one) stand in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import art_langgraph as art
from art_langgraph.backend.base import Backend
from tests.backend.test_local_backend import LR, _groups

METHODS = [
    "register",
    "get_step",
    "train",
    "train_sft",
    "log",
    "record_evaluation",
    "delete_checkpoints",
    "close",
]


class Delegating:
    __slots__ = ("calls", "inner")

    def __init__(self, inner: art.LocalBackend) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name: str) -> Any:
        if name not in METHODS:
            raise AttributeError(name)  # anything beyond the protocol is a contract breach
        self.calls.append(name)
        return getattr(self.inner, name)


for _name in METHODS:  # Protocol isinstance checks look at the class
    setattr(Delegating, _name, property(lambda self, n=_name: Delegating.__getattr__(self, n)))


def test_local_backend_is_a_backend(tmp_path: Path) -> None:
    assert isinstance(art.LocalBackend(path=tmp_path), Backend)


async def test_a_model_needs_only_the_protocol(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as inner:
        backend = Delegating(inner)
        assert isinstance(backend, Backend)
        model = art.TrainableModel(name="proto", project="tests", base_model="tiny")
        await model.register(backend)  # type: ignore[arg-type]
        result = await model.train(await _groups(model), LR)
        assert result.step == 1 and await model.get_step() == 1
        await model.log(await _groups(model, n_groups=1), split="val")
        assert await model.delete_checkpoints(keep_last=1) == []
    assert {"register", "train", "get_step", "log", "delete_checkpoints"} <= set(backend.calls)


async def test_registering_with_something_else_is_a_clear_error() -> None:
    model = art.Model(name="m", project="p", base_model="tiny")
    with pytest.raises(art.UsageError, match="is not a Backend"):
        await model.register(object())  # type: ignore[arg-type]
