"""The local Langfuse receiver, on a free loopback port, for each test that asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from art_langgraph.serving.runner import ServerHandle, start_app_server
from tests.integrations.langfuse.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, ServerHandle]]:
    rec = Receiver()
    handle = start_app_server(rec.app())
    yield rec, handle
    handle.stop()
