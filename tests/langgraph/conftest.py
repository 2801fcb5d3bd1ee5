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
    await warm_start(model)
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
