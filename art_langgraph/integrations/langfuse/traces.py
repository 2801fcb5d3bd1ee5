"""A trajectory as a Langfuse trace: OpenTelemetry spans and score bodies (extra `langfuse`).

Each trajectory becomes one trace:

    agent observation "rollout"  (input: the first user turn, output: the last message)
      generation "chat"          one per LLM call: model "name@step", messages, output,
                                 tool calls, usage, sampling parameters, recorded times
      tool "<tool name>"         one per tool execution: arguments, result, error (level ERROR)
    scores: reward, independent_reward, ruler_score (the judge's explanation as comment)
    tags: art, model:<name>, split:<split>, step:<N>; metadata: group, scenario, trajectory id

The trace id is `Langfuse.create_trace_id(seed=trajectory.id)` and every observation and
score id is derived from it (`span_id`), so a re-export overwrites instead of duplicating.

Times. The SDK's `start_observation` cannot take a start time (langfuse-python#1377), so
the observations are built here as OpenTelemetry `ReadableSpan`s with the recorded start
and end times and the attributes Langfuse documents for OTLP ingestion; sender.py encodes
and posts them.

A graph already traced with `langfuse.langchain.CallbackHandler`: capture records that
trace's id (`metadata["langfuse_linked_trace_id"]`, see chat_model.py). Its trajectory then
becomes an "art trajectory" span (step, split, reward) and the scores on *that* trace,
instead of a second trace; the generations and tools there are the handler's.

Left out: sending (sender.py); media uploads; sessions beyond one per (model, split, step).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from art_langgraph.integrations.langfuse.config import EXTRA_MISSING, LangfuseConfig
from art_langgraph.runtime.names import inference_name
from art_langgraph.trajectories.logger_protocol import RunInfo
from art_langgraph.trajectories.trajectory import LLMCall, ToolEvent, Trajectory, TrajectoryGroup

try:
    from langfuse import Langfuse
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(EXTRA_MISSING) from exc

SCOPE = "art_langgraph"
"""The OpenTelemetry instrumentation scope of every span sent."""


# ------------------------------------------------------------------ ids
def trace_id_for(trajectory: Trajectory) -> str:
    """The trace a trajectory is exported to: the one its capture linked (a user's
    CallbackHandler trace), else `Langfuse.create_trace_id(seed=trajectory.id)`."""
    linked = trajectory.metadata.get("langfuse_linked_trace_id")
    if isinstance(linked, str) and len(linked) == 32:
        return linked
    return Langfuse.create_trace_id(seed=trajectory.id)


def span_id(trace_id: str, key: str) -> int:
    """The id of the observation `key` ("root", "call:3", "tool:0") of a trace: stable, so
    a re-export overwrites it; its hex form (`format(id, "016x")`) is Langfuse's id."""
    raw = int.from_bytes(hashlib.sha256(f"{trace_id}:{key}".encode()).digest()[:8], "big")
    return raw or 1  # 0 is OpenTelemetry's invalid span id


def _ns(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp() * 1e9)


# ------------------------------------------------------------------ spans
def _json(value: Any, limit: int) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > limit:
        text = json.dumps({"truncated": True, "chars": len(text), "head": text[:limit]})
    return text


def _attr(value: Any) -> Any:
    """An OpenTelemetry attribute value: str/bool/int/float as is, the rest as JSON."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return json.dumps(value, default=str)


@dataclass
class Batch:
    """One backend call's groups, as the exporter sends them: one step of one split."""

    run: RunInfo
    """The model they belong to."""
    step: int
    """The step (see `TrajectoryLogger.log_trajectories`)."""
    split: str
    """"train", "val", ..."""
    groups: list[TrajectoryGroup]
    """The groups, their trajectories' metadata holding the trace ids and URLs."""
    trajectories: int = 0
    """How many trajectories the groups hold."""


@dataclass
class SpanBuilder:
    """Collects the spans of a batch's trajectories (`trajectory`), in `spans`."""

    config: LangfuseConfig
    run: RunInfo
    step: int
    split: str
    spans: list[ReadableSpan] = field(default_factory=list)

    def add(
        self,
        trace_id: str,
        key: str,
        name: str,
        start: int,
        end: int,
        attributes: dict[str, Any],
        parent: int | None,
        error: str | None = None,
    ) -> int:
        sid = span_id(trace_id, key)
        tid = int(trace_id, 16)
        ctx = SpanContext(tid, sid, is_remote=False, trace_flags=TraceFlags(1))
        parent_ctx = (
            SpanContext(tid, parent, is_remote=False, trace_flags=TraceFlags(1))
            if parent is not None
            else None
        )
        attrs = {k: v for k, v in attributes.items() if v is not None}
        if self.config.environment:
            attrs["langfuse.environment"] = self.config.environment
        status = Status(StatusCode.ERROR, error) if error else Status(StatusCode.OK)
        self.spans.append(
            ReadableSpan(
                name=name,
                context=ctx,
                parent=parent_ctx,
                resource=Resource.create({"service.name": "art_langgraph"}),
                attributes=attrs,
                instrumentation_scope=InstrumentationScope(SCOPE),
                status=status,
                start_time=start,
                end_time=max(end, start),
            )
        )
        return sid

    def io(self, kind: str, value: Any) -> dict[str, Any]:
        return {f"langfuse.observation.{kind}": _json(value, self.config.max_field_chars)}

    def trajectory(self, t: Trajectory, group_index: int, group: TrajectoryGroup) -> None:
        trace_id = trace_id_for(t)
        linked = "langfuse_linked_trace_id" in t.metadata
        start = _ns(t.started_at)
        calls_end = [
            _ns(c.started_at) + int((c.latency_s or 0) * 1e9) for c in t.calls if c.started_at
        ]
        end = _ns(t.finished_at) if t.finished_at else max([start, *calls_end])
        scenario = t.metadata.get("scenario", group.metadata.get("scenario"))
        tags = ["art", f"model:{self.run.name}", f"split:{self.split}", f"step:{self.step}"]
        meta = {
            "project": self.run.project,
            "model": inference_name(self.run.name, self.step),
            "base_model": self.run.base_model,
            "step": self.step,
            "split": self.split,
            "group": group_index,
            "scenario": scenario,
            "trajectory_id": t.id,
            "reward": t.reward,
        }
        attrs: dict[str, Any] = {
            "langfuse.observation.type": "span" if linked else "agent",
            "langfuse.trace.tags": tags,
            "session.id": f"{self.run.project}/{self.run.name}/{self.split}/step-{self.step}",
            **{f"langfuse.trace.metadata.{k}": _attr(v) for k, v in meta.items()},
            **{f"langfuse.observation.metadata.{k}": _attr(v) for k, v in meta.items()},
        }
        if not linked:
            attrs["langfuse.trace.name"] = f"{self.run.name} {self.split} rollout"
            first_user = next((m for m in t.messages if m.get("role") == "user"), None)
            attrs.update(self.io("input", first_user or (t.messages[:1] or None)))
            attrs.update(self.io("output", t.messages[-1] if t.messages else None))
            attrs["langfuse.trace.input"] = attrs["langfuse.observation.input"]
            attrs["langfuse.trace.output"] = attrs["langfuse.observation.output"]
        else:
            attrs.update(self.io("output", {"reward": t.reward, "metrics": t.metrics}))
        error = None
        if t.exception is not None:
            error = f"{t.exception.type}: {t.exception.message}"
            attrs["langfuse.observation.level"] = "ERROR"
            attrs["langfuse.observation.status_message"] = error
        root = self.add(
            trace_id,
            "root",
            "art trajectory" if linked else "rollout",
            start,
            end,
            attrs,
            None,
            error,
        )
        if linked:
            return  # the user's handler traced the turns and tools of this trace
        cursor = start
        for i, call in enumerate(t.calls):
            cursor = self.generation(trace_id, root, i, call, cursor)
        for i, event in enumerate(t.tool_events):
            self.tool(trace_id, root, i, event, start)

    def generation(self, trace_id: str, root: int, i: int, call: LLMCall, cursor: int) -> int:
        start = _ns(call.started_at) if call.started_at else cursor
        end = start + int((call.latency_s or 0) * 1e9)
        usage = call.usage or {}
        usage_details = {
            k: v
            for k, v in {
                "input": usage.get("prompt_tokens", len(call.prompt_token_ids or []) or None),
                "output": usage.get(
                    "completion_tokens", len(call.completion_token_ids or []) or None
                ),
            }.items()
            if v is not None
        }
        if usage_details:
            usage_details["total"] = sum(usage_details.values())
        lps = call.logprobs or []
        meta = {
            "finish_reason": call.finish_reason,
            "trainable": call.trainable,
            "adapter_step": call.adapter_step,
            "completion_tokens": len(call.completion_token_ids or []),
            "mean_logprob": (sum(lps) / len(lps)) if lps else None,
            "tools": [(s.get("function") or {}).get("name") for s in call.tools or []] or None,
            "tool_choice": call.tool_choice,
        }
        attrs = {
            "langfuse.observation.type": "generation",
            "langfuse.observation.model.name": call.model
            or inference_name(self.run.name, self.step),
            "langfuse.observation.model.parameters": json.dumps(call.sampling, default=str),
            "langfuse.observation.usage_details": json.dumps(usage_details),
            **self.io("input", call.messages),
            **self.io("output", call.response_message),
            **{f"langfuse.observation.metadata.{k}": _attr(v) for k, v in meta.items()},
        }
        self.add(trace_id, f"call:{i}", "chat", start, end, attrs, root)
        return end

    def tool(self, trace_id: str, root: int, i: int, event: ToolEvent, fallback: int) -> None:
        start = _ns(event.started_at) if event.started_at else fallback
        end = start + int((event.latency_s or 0) * 1e9)
        attrs: dict[str, Any] = {
            "langfuse.observation.type": "tool",
            **self.io("input", event.args),
            **self.io("output", {"error": event.error} if event.error else event.result),
            "langfuse.observation.metadata.tool_call_id": event.tool_call_id,
        }
        if event.error:
            attrs["langfuse.observation.level"] = "ERROR"
            attrs["langfuse.observation.status_message"] = event.error
        self.add(trace_id, f"tool:{i}", event.name, start, end, attrs, root, event.error)


def _ruler_explanation(t: Trajectory) -> str | None:
    lines = [line[len("RULER: ") :] for line in t.logs if line.startswith("RULER: ")]
    return lines[-1] if lines else None


def score_bodies(
    t: Trajectory, environment: str | None, config_ids: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The scores a trajectory's trace gets: reward, and the RULER pair when it was judged;
    each with its score config's id (`configId`) when `config_ids` names it."""
    trace_id = trace_id_for(t)
    explanation = _ruler_explanation(t)
    values = {"reward": t.reward}
    for name in ("independent_reward", "ruler_score"):
        if isinstance(t.metrics.get(name), int | float):
            values[name] = float(t.metrics[name])
    bodies = []
    for name, value in values.items():
        if not math.isfinite(value):
            continue
        body: dict[str, Any] = {
            "id": f"{trace_id}-{name}",
            "traceId": trace_id,
            "name": name,
            "value": value,
            "dataType": "NUMERIC",
            "metadata": {"source": "art_langgraph", "trajectory_id": t.id},
        }
        if explanation and name in ("reward", "ruler_score") and "ruler_score" in values:
            body["comment"] = explanation
        if environment:
            body["environment"] = environment
        if config_ids and name in config_ids:
            body["configId"] = config_ids[name]
        bodies.append(body)
    return bodies
