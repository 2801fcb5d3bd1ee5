"""`capture`'s hook for tracers (`register_trace_linker`): a user's own tracing handler's
trace id is kept with the trajectory, for the tracers the package root registers and any
other registered the same way.

Real LangChain runs: a `RunnableLambda` calling a chat model, with the user's handler among
the run's callbacks, as a graph passes them.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.runnables import RunnableLambda

import art_langgraph as art
from art_langgraph.tracing.callback import register_trace_linker

TRACE = "0123456789abcdef" * 2


class ToyTracerHandler(BaseCallbackHandler):
    """Stands for a tracing tool's LangChain handler: its module names the tool."""

    def __init__(self) -> None:
        self.runs: list[UUID] = []

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kw: Any
    ) -> None:
        self.runs.append(run_id)


ToyTracerHandler.__module__ = "toytracer.langchain"


def toy_trace_id(handler: Any, run_id: UUID, parent_run_id: UUID | None) -> str | None:
    """The linker the test registers: the trace only for a run the handler saw."""
    assert isinstance(handler, ToyTracerHandler)
    return TRACE if run_id in handler.runs or parent_run_id is not None else None


def run_chain(handler: BaseCallbackHandler | None) -> art.Trajectory:
    llm = FakeListChatModel(responses=["Canberra"])
    chain = RunnableLambda(lambda q: llm.invoke(q))
    with art.capture() as traj:
        chain.invoke("Capital of Australia?", {"callbacks": [handler] if handler else []})
    return traj


def test_a_registered_tracer_links_its_trace() -> None:
    register_trace_linker("toytracer", toy_trace_id, "toytracer_trace_id")
    assert run_chain(ToyTracerHandler()).metadata["toytracer_trace_id"] == TRACE
    assert "toytracer_trace_id" not in run_chain(None).metadata  # no handler, no link


def test_the_package_root_registers_langfuses_linker() -> None:
    from art_langgraph.integrations.trace_links import langfuse_trace_id
    from art_langgraph.tracing.callback import _TRACE_LINKERS

    linkers = {(t.module_prefix, t.link, t.metadata_key) for t in _TRACE_LINKERS}
    assert ("langfuse", langfuse_trace_id, "langfuse_linked_trace_id") in linkers
