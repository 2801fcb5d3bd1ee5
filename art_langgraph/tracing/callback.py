"""`TrajectoryCallback`: the LangChain callback handler that records a run's chat-model
and tool calls into a `Trajectory`.

Each chat-model call becomes an `LLMCall`, each tool call a `ToolEvent` (name, args,
result or error, latency), and the final conversation of the outermost graph fills
`messages`; an exception of the run is recorded on the trajectory. A trainable chat
model's call (`ART_METADATA_KEY` in its metadata) is recorded from the wire: when its run
starts, the handler names the run in the context that will send the request
(`wire_sink`; LangChain calls a `run_inline` handler there), the capturing transport
(`openai_capture.py`) hands it the calls of that request (marked by `CHAT_MODEL_HEADER`;
a retried request's last answer is kept), and the handler adds what only LangChain
knows: the graph position, the run's metadata, and whether it trains (`train_nodes`).
Calls of chat models this package does not serve (a judge, a planner on another
provider) are recorded from LangChain's view of the reply, without token ids, and never
train. Tracers register a linker (`register_trace_linker`) that stamps their trace id on
the trajectory.

The handler never raises into the user's graph: a failure inside it is logged on the
trajectory and skipped. `capture.py` attaches it to every run inside a block; it can also
be passed explicitly (`config={"callbacks": [handler]}`).

Left out: LangChain's legacy text LLMs (`on_llm_start`), which chat graphs do not use.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, convert_to_openai_messages
from langchain_core.outputs import LLMResult
from langchain_core.runnables.config import var_child_runnable_config

from art_langgraph.errors import UsageError
from art_langgraph.trajectories.plain import plain
from art_langgraph.trajectories.trajectory import (
    TRAIN_NODES_KEY,
    ExceptionInfo,
    LLMCall,
    ToolEvent,
    Trajectory,
)

log = logging.getLogger(__name__)


CHAT_MODEL_HEADER = "X-ART-Chat-Model"
"""The header `TrainableChatModel` sends with each request: the capturing transport hands
only such requests to the run's handlers (`wire_sink`)."""


@dataclass(frozen=True)
class WireSink:
    """A trainable chat model's LangChain run whose request is under way: the capturing
    transport hands the calls it reads off the wire to these handlers (`hold_wire`)."""

    run_id: UUID
    handlers: tuple[TrajectoryCallback, ...]


_SINK: contextvars.ContextVar[WireSink | None] = contextvars.ContextVar(
    "art_wire_sink", default=None
)


def wire_sink() -> WireSink | None:
    """The run whose chat-model request this context is sending, if one is under way.
    Set by the run's capture handlers in `on_chat_model_start`, which LangChain calls
    inline, in the context that then sends the request (`run_inline`)."""
    return _SINK.get()


ART_METADATA_KEY = "art_trainable"
"""Metadata key that marks a chat model's calls as trainable for the capture handler
(`TrainableChatModel` sets it)."""


_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stop",
    "seed",
    "logprobs",
)


class TrajectoryCallback(BaseCallbackHandler):
    """Records LLM and tool calls into `trajectory`, keyed by LangChain run ids."""

    raise_error = False
    run_inline = True

    def __init__(
        self, trajectory: Trajectory | None = None, *, train_nodes: TrainNodes | None = None
    ) -> None:
        self.trajectory = trajectory if trajectory is not None else Trajectory()
        self.train_nodes = _node_filter(train_nodes)
        if (names := getattr(self.train_nodes, "names", None)) is not None:
            # kept with the rollout so the trainer can check them over a whole step
            self.trajectory.metadata[TRAIN_NODES_KEY] = sorted(names)
        self.resumed = False
        """Whether a run in this block was resumed from an interrupt (`Command(resume=...)`)."""
        self.request_seeds: Iterator[int] | None = None
        """The sampling seeds of the trainable chat model's requests in this block, in
        order (`capture(seed=...)`); None: its requests carry no seed."""
        self._llm: dict[UUID, dict[str, Any]] = {}
        self._wire: dict[UUID, list[LLMCall]] = {}
        self._tools: dict[UUID, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _guard(self, what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # capture must never break the user's graph
            log.warning("capture: %s failed: %r", what, exc)
            self.trajectory.logs.append(f"capture: {what} failed: {exc!r}")

    # ------------------------------------------------------------- chat models
    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        def start() -> None:
            params = kwargs.get("invocation_params") or {}
            meta = metadata or {}
            for key, linked in _linked_traces(run_id, parent_run_id):
                self.trajectory.metadata.setdefault(key, linked)
            self._llm[run_id] = {
                "messages": convert_to_openai_messages(messages[0]) if messages else [],
                "tools": params.get("tools"),
                "tool_choice": params.get("tool_choice"),
                "sampling": {k: params[k] for k in _SAMPLING_KEYS if params.get(k) is not None},
                "trainable": bool(meta.get(ART_METADATA_KEY)),
                "started_at": datetime.now(UTC),
                "t0": time.perf_counter(),
                "position": _graph_position(meta),
                "metadata": {
                    k: v
                    for k, v in meta.items()
                    if k.startswith(("langgraph_", "art_")) and _is_plain(v)
                }
                | ({"tags": list(tags)} if tags else {}),
            }
            if self._llm[run_id]["trainable"]:  # its request's calls come back to us
                sink = _SINK.get()
                others = sink.handlers if sink is not None and sink.run_id == run_id else ()
                _SINK.set(WireSink(run_id, (*others, self)))

        self._guard("on_chat_model_start", start)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        self._guard("on_llm_end", self._end_llm, response, run_id)

    def hold_wire(self, run_id: UUID, calls: list[LLMCall]) -> None:
        """Keep the calls that run `run_id`'s request made, as the capturing transport read
        them off the wire (`wire_sink`), until the run ends and its callback records them;
        a retried request's last answer wins."""
        with self._lock:
            self._wire[run_id] = calls

    @staticmethod
    def _release(run_id: UUID) -> None:
        """The run has ended: its sink takes no more calls."""
        sink = _SINK.get()
        if sink is not None and sink.run_id == run_id:
            _SINK.set(None)

    def _ended(self, run_id: UUID) -> tuple[dict[str, Any] | None, list[LLMCall] | None]:
        """The run has ended: its start and the calls its request made on the wire."""
        self._release(run_id)
        start = self._llm.pop(run_id, None)
        with self._lock:
            return start, self._wire.pop(run_id, None)

    def _end_llm(self, response: LLMResult, run_id: UUID) -> None:
        start, wire = self._ended(run_id)
        if start is None:
            return
        if wire:
            calls = wire
        elif response.generations and response.generations[0]:
            calls = [_seen_by_langchain(start, response.generations[0][0], response.llm_output)]
        else:
            return
        for call in calls:
            self.record_call(self._decorated(start, call))
        if start["trainable"] and calls[0].completion_token_ids is None:  # once per trajectory
            call = calls[0]
            head = "capture: a call of the trainable model cannot train"
            where = f"in node {call.node!r}" if call.node else "outside any graph node"
            why = (
                "its reply carried no token ids"
                if wire
                else "its request did not pass through the model's capturing transport"
            )
            note = (
                f"{head} ({where}, model {call.model!r}); recorded with trainable=False: {why}. "
                "A request that turns them off (extra_body={'return_token_ids': False}) or a "
                "server that does not return them is the cause."
            )
            with self._lock:
                first = not any(line.startswith(head) for line in self.trajectory.logs)
                if first:
                    self.trajectory.logs.append(note)
            if first:  # after the call is recorded: a warnings filter that raises loses nothing
                warnings.warn(note, UserWarning, stacklevel=2)

    @staticmethod
    def _decorated(start: dict[str, Any], call: LLMCall) -> LLMCall:
        """`call` plus what only the callback knows: the graph position, the run's metadata,
        and whether the model may train on it (a trainable model's call with token ids)."""
        call.metadata = dict(start["metadata"]) | call.metadata
        call.trainable = start["trainable"] and call.completion_token_ids is not None
        for field, value in start["position"].items():
            setattr(call, field, value)
        return call

    def record_call(self, call: LLMCall) -> None:
        """Add a finished call, in the order the calls started (concurrent calls end in any
        order); a trainable call outside `train_nodes` is kept, marked not trainable."""
        if call.trainable and self.train_nodes is not None and not self.train_nodes(call):
            call.trainable = False
            call.metadata["art_excluded"] = "train_nodes"
        with self._lock:
            calls = self.trajectory.calls
            calls.append(call)
            calls.sort(key=lambda c: c.started_at or datetime.min.replace(tzinfo=UTC))

    def record_tool_event(self, event: ToolEvent) -> bool:
        """Add a tool event seen outside LangChain (a tool result sent back to the model),
        unless one for the same `tool_call_id` is already there; True when added."""
        with self._lock:
            events = self.trajectory.tool_events
            if event.tool_call_id is not None and any(
                e.tool_call_id == event.tool_call_id for e in events
            ):
                return False
            events.append(event)
            return True

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        def fail() -> None:
            start, wire = self._ended(run_id)
            if start is None:
                return
            self.trajectory.logs.append(f"LLM call failed: {error!r}")
            if wire:  # sampled, then refused by the client (openai's parse errors): record it
                for call in wire:
                    call.metadata["art_client_error"] = repr(error)[:500]
                    self.record_call(self._decorated(start, call))

        self._guard("on_llm_error", fail)

    # ------------------------------------------------------------------- tools
    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        inputs: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        def start() -> None:
            self._tools[run_id] = {
                "name": kwargs.get("name") or serialized.get("name") or "tool",
                "args": inputs if inputs is not None else input_str,
                "tool_call_id": kwargs.get("tool_call_id"),
                "started_at": datetime.now(UTC),
                "t0": time.perf_counter(),
            }

        self._guard("on_tool_start", start)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        def end() -> None:
            start = self._tools.pop(run_id, None)
            if start is None:
                return
            content = getattr(output, "content", output)
            status = getattr(output, "status", "success")
            error = str(content) if status == "error" else None
            self._add_tool(start, None if error else content, error)

        self._guard("on_tool_end", end)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        def fail() -> None:
            start = self._tools.pop(run_id, None)
            if start is not None:
                self._add_tool(start, None, f"{type(error).__name__}: {error}")

        self._guard("on_tool_error", fail)

    def _add_tool(self, start: dict[str, Any], result: Any, error: str | None) -> None:
        args = start["args"]
        event = ToolEvent(
            name=start["name"],
            args=args if isinstance(args, dict | str) else str(args),
            tool_call_id=start["tool_call_id"],
            result=result,
            error=error,
            latency_s=time.perf_counter() - start["t0"],
            started_at=start["started_at"],
        )
        with self._lock:
            self.trajectory.tool_events.append(event)

    # ------------------------------------------------------------------ chains
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if parent_run_id is not None:
            return

        def start() -> None:
            self.trajectory.interrupted = False  # until this run stops at one
            resume = getattr(inputs, "resume", None) if _is_command(inputs) else None
            if resume is not None:
                self.resumed = True
                self.trajectory.resume_values.append(plain(resume))

        self._guard("on_chain_start", start)

    def on_chain_end(
        self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        if parent_run_id is not None:
            return

        def end() -> None:
            messages = outputs.get("messages") if isinstance(outputs, dict) else None
            if isinstance(messages, Sequence) and messages and isinstance(messages[0], BaseMessage):
                self.trajectory.messages = convert_to_openai_messages(list(messages))

        self._guard("on_chain_end", end)

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if _is_interrupt(error):  # raised in the node; the graph itself ends normally
            self.trajectory.interrupted = True
        elif parent_run_id is None:
            self._guard("on_chain_error", self._set_exception, error)

    def _set_exception(self, error: BaseException) -> None:
        if self.trajectory.exception is None:
            self.trajectory.exception = ExceptionInfo.from_exception(error)

    def finish(self) -> Trajectory:
        """Fill `messages` from the last call when no graph output did, and stamp the end."""
        traj = self.trajectory
        if not traj.messages and traj.calls:
            last = traj.calls[-1]
            traj.messages = last.to_messages()
            ids = {tc.get("id") for tc in last.response_message.get("tool_calls") or []}
            for ev in traj.tool_events:
                if ev.tool_call_id in ids:
                    content = ev.error if ev.error is not None else ev.result
                    traj.messages.append(
                        {"role": "tool", "tool_call_id": ev.tool_call_id, "content": str(content)}
                    )
        traj.finish()
        return traj


TrainNodes = Collection[str] | Callable[[LLMCall], bool]
"""What `capture(train_nodes=...)` takes: node names, or a predicate over a call."""


def _node_filter(train_nodes: TrainNodes | None) -> Callable[[LLMCall], bool] | None:
    if train_nodes is None or callable(train_nodes):
        return train_nodes
    if isinstance(train_nodes, str):
        names = frozenset([train_nodes])
    else:
        names = frozenset(train_nodes)
        if not names or not all(isinstance(n, str) for n in names):
            raise UsageError(
                f"train_nodes takes node names or a predicate over an LLMCall, not {train_nodes!r}"
            )

    def named(call: LLMCall) -> bool:
        return call.node in names or any(n in names for n in call.namespace)

    named.names = names  # type: ignore[attr-defined]
    return named


def _is_command(value: Any) -> bool:
    return type(value).__name__ == "Command" and type(value).__module__.startswith("langgraph")


def _is_interrupt(error: BaseException) -> bool:
    errors = sys.modules.get("langgraph.errors")
    return errors is not None and isinstance(error, errors.GraphInterrupt)


TraceLinkFn = Callable[[Any, UUID, "UUID | None"], "str | None"]
"""`(handler, run_id, parent_run_id) -> trace id or None`: a tracer's linker."""


@dataclass(frozen=True)
class _TraceLinker:
    module_prefix: str
    link: TraceLinkFn
    metadata_key: str


_TRACE_LINKERS: list[_TraceLinker] = []
"""The registered tracers' linkers (`register_trace_linker`), in order."""


def register_trace_linker(module_prefix: str, link: TraceLinkFn, metadata_key: str) -> None:
    """Link captured runs to a tracing tool's own traces. When a chat-model run has among its
    callbacks a handler whose class's module starts with `module_prefix`, `link` is called
    as `link(handler, run_id, parent_run_id)`; the trace id it returns (or None) is kept as
    `trajectory.metadata[metadata_key]`. The package root registers the integrations'
    (Langfuse's handler: `art_langgraph.integrations.trace_links`), so this module names
    none of them."""
    linker = _TraceLinker(module_prefix, link, metadata_key)
    if linker not in _TRACE_LINKERS:
        _TRACE_LINKERS.append(linker)


def _linked_traces(run_id: UUID, parent_run_id: UUID | None) -> list[tuple[str, str]]:
    """`(metadata key, trace id)` for each registered tracer whose handler is among this
    run's callbacks (found in the run's config, LangChain's `var_child_runnable_config`)."""
    if not _TRACE_LINKERS:
        return []
    callbacks = (var_child_runnable_config.get() or {}).get("callbacks")
    handlers = getattr(callbacks, "handlers", callbacks)
    out: list[tuple[str, str]] = []
    for h in handlers if isinstance(handlers, list) else []:
        module = type(h).__module__
        for linker in _TRACE_LINKERS:
            if not module.startswith(linker.module_prefix):
                continue
            trace_id = linker.link(h, run_id, parent_run_id)
            if trace_id is not None:
                out.append((linker.metadata_key, trace_id))
    return out


def _seen_by_langchain(
    start: dict[str, Any], gen: Any, llm_output: dict[str, Any] | None
) -> LLMCall:
    """The call of a chat model whose requests this package does not send (a judge, a
    planner on another provider): the request LangChain made and its reply, as LangChain
    saw them. It has no token ids, so it never trains."""
    message = getattr(gen, "message", None)
    meta = getattr(message, "response_metadata", None) or {}
    info = gen.generation_info or {}
    usage = getattr(message, "usage_metadata", None)
    counts = None
    if usage:
        counts = {
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["total_tokens"],
        }
        cached = (usage.get("input_token_details") or {}).get("cache_read")
        if type(cached) is int:
            counts["cached_tokens"] = cached
    return LLMCall(
        messages=start["messages"],
        tools=start["tools"],
        tool_choice=start["tool_choice"],
        sampling=start["sampling"],
        response_message=(
            convert_to_openai_messages([message])[0]
            if message is not None
            else {"role": "assistant"}
        ),
        model=meta.get("model_name") or (llm_output or {}).get("model_name"),
        finish_reason=meta.get("finish_reason") or info.get("finish_reason"),
        latency_s=time.perf_counter() - start["t0"],
        usage=counts,
        started_at=start["started_at"],
        trainable=False,
    )


def _graph_position(meta: dict[str, Any]) -> dict[str, Any]:
    """Where in a LangGraph run a chat-model call happens, as `LLMCall` fields: its node,
    the node path from the root graph (from `langgraph_checkpoint_ns`, "outer:task|inner:task"),
    the superstep, the thread, and the root checkpoint its step started from (LangGraph keeps
    that in the running config's `checkpoint_map`, not in the callback metadata)."""
    node = meta.get("langgraph_node")
    if node is None:
        return {}
    ns = meta.get("langgraph_checkpoint_ns")
    path = [part.split(":", 1)[0] for part in ns.split("|")] if isinstance(ns, str) and ns else []
    step = meta.get("langgraph_step")
    thread = meta.get("thread_id")
    configurable = (var_child_runnable_config.get() or {}).get("configurable") or {}
    checkpoint = (configurable.get("checkpoint_map") or {}).get("")
    return {
        "node": str(node),
        "namespace": path or [str(node)],
        "graph_step": step if type(step) is int else None,
        "thread_id": str(thread) if thread is not None else None,
        "checkpoint_id": checkpoint if isinstance(checkpoint, str) else None,
    }


def _is_plain(v: Any) -> bool:
    return isinstance(v, str | int | float | bool | type(None) | list | tuple)
