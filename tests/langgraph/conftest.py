"""One backend and one SFT-warm-started tool-calling model for the LangGraph tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import art_langgraph as art
from tests.langgraph.tools import warm_start


@pytest.fixture(scope="session")
async def lg_backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    async with art.LocalBackend(path=tmp_path_factory.mktemp("lg")) as backend:
        yield backend


@pytest.fixture(scope="session")
async def tool_model(lg_backend: art.LocalBackend) -> art.TrainableModel:
    """The tiny model after a short SFT on tool-call demonstrations (it calls tools, imperfectly)."""
    model = art.TrainableModel(name="toolagent", project="lg", base_model="tiny")
    await model.register(lg_backend)
    # 40 epochs, not the example's 20: after 20 the model's calls were valid on one machine
    # and mostly `{}` on another (1 good call of 8 at temperature 0; 5 of 8 after 40).
    await warm_start(model, epochs=40)
    return model


@pytest.fixture
async def fresh_model(
    lg_backend: art.LocalBackend, request: pytest.FixtureRequest
) -> art.TrainableModel:
    """An untrained model with a name of its own (a test may train it)."""
    model = art.TrainableModel(
        name=f"m-{request.node.name[:40]}".replace("[", "-").replace("]", ""),
        project="lg",
        base_model="tiny",
    )
    await model.register(lg_backend)
    return model
