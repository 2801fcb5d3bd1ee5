"""Which trace a user's own tracing callback handler opened for a captured run: Langfuse's.

A user who already traces their graph with Langfuse's LangChain `CallbackHandler` gets a
trace from it per run; `capture()` records that trace's id in the trajectory
(`metadata["langfuse_linked_trace_id"]`), so the exported rollout lands in the same trace
instead of a second one (`integrations/langfuse/traces.py`). The package root registers
`langfuse_trace_id` with `callback.register_trace_linker`, for handlers of the `langfuse`
package only; the core names no tracer.

This module imports nothing of Langfuse's: it reads the handler it is given.

Left out: other tracers' handlers (LangSmith, OpenTelemetry's instrumentors), which a
`register_trace_linker` call of their own would add.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID


def langfuse_trace_id(handler: Any, run_id: UUID, parent_run_id: UUID | None) -> str | None:
    """The trace `handler` (a `langfuse.langchain.CallbackHandler`) opened for this run or
    its parent, else its `last_trace_id`; None when it has none (a 32-hex-digit id only).

    The run-to-observation map is the handler's `_runs`, which its SDK 5.x keeps and
    exposes no public accessor for; a later SDK without it falls back to `last_trace_id`,
    its public attribute."""
    runs = getattr(handler, "_runs", None) or {}
    obs = runs.get(run_id) or runs.get(parent_run_id)
    trace_id = getattr(obs, "trace_id", None) or getattr(handler, "last_trace_id", None)
    return trace_id if isinstance(trace_id, str) and len(trace_id) == 32 else None
