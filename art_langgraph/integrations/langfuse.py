"""Every rollout as a Langfuse trace, and review scores back as rewards (extra `langfuse`).

Export. `LangfuseLogger` is a `TrajectoryLogger` (art_langgraph/loggers.py): turn it on
with `LocalBackend(loggers=[LangfuseLogger()])` or `RemoteBackend(url, loggers=[...])`,
or by setting `LANGFUSE_PUBLIC_KEY` / `LANGFUSE_SECRET_KEY` (`LANGFUSE_BASE_URL`). Each
trajectory becomes one trace:

    agent observation "rollout"  (input: the first user turn, output: the last message)
      generation "chat"          one per LLM call: model "name@step", messages, output,
                                 tool calls, usage, sampling parameters, recorded times
      tool "<tool name>"         one per tool execution: arguments, result, error (level ERROR)
    scores: reward, independent_reward, ruler_score (the judge's explanation as comment)
    tags: art, model:<name>, split:<split>, step:<N>; metadata: group, scenario, trajectory id

The trace id is `Langfuse.create_trace_id(seed=trajectory.id)` and every observation and
score id is derived from it, so a re-export overwrites instead of duplicating. The trace
id and URL go into `trajectory.metadata` (`langfuse_trace_id`, `langfuse_trace_url`)
before the backend saves the trajectories.

Times. The SDK's `start_observation` cannot take a start time (langfuse-python#1377), so
the observations are built as OpenTelemetry `ReadableSpan`s with the recorded start and
end times, encoded by OpenTelemetry's OTLP encoder, and posted to the endpoint the SDK
itself exports to (`/api/public/otel/v1/traces`, the same headers, gzip), with the
attributes Langfuse documents for OTLP ingestion. Scores, score listing and project
lookup go through the SDK's API client (`langfuse.api.LangfuseAPI`). No `Langfuse`
client is constructed, so a user's own Langfuse client and tracer provider are untouched.

Fail-soft. Export runs on a background thread. With no server, or a server that errors,
one warning is logged and training carries on; the trajectories JSONL stays the source of
truth, and `art-langgraph langfuse export MODEL_DIR` re-sends the batches that did not
get through (`langfuse_exports.jsonl` in the model's folder records those that did).

A graph already traced with `langfuse.langchain.CallbackHandler`: capture records that
trace's id (`metadata["langfuse_trace_id"]`, see chat_model.py). The export then adds to
*that* trace a "art trajectory" span (step, split, reward) and the scores, instead of a
second trace; the generations and tools there are the handler's.

Review. `import_scores` reads the scores given to exported traces (by name, source, or
annotation queue) and applies them as rewards; `approved_sft_file` writes the approved
trajectories as an SFT file for `train_sft`. Annotation queues (a sample of rollouts sent
for review), judge calibration and corrections as SFT examples: langfuse_review.py.

Score configs. Every score names its config (`configId`): `ensure_score_configs` in
langfuse_scoring.py creates or reuses them once per sender. Held-out evaluations as dataset
runs: langfuse_datasets.py.

Left out: prompts and experiments; media uploads; sessions beyond one per
(model, split, step).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from art_langgraph.backend.checkpoints import recorded_base_model
from art_langgraph.errors import UsageError
from art_langgraph.integrations.langfuse_scoring import (
    REVIEW_DECISION,
    REVIEW_SCORE,
    SCORE_CONFIGS,
    ensure_score_configs,
)
from art_langgraph.loggers import RunInfo
from art_langgraph.trajectory import (
    LLMCall,
    ToolEvent,
    Trajectory,
    TrajectoryGroup,
    read_groups,
    write_jsonl,
)

try:
    from langfuse import Langfuse
    from langfuse.api import LangfuseAPI
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the Langfuse integration needs the langfuse extra: pip install 'art-langgraph[langfuse]'"
    ) from exc

__all__ = [
    "ExportReport",
    "LangfuseConfig",
    "LangfuseLogger",
    "ReviewResult",
    "approved_sft_file",
    "export_folder",
    "import_scores",
    "trace_id_for",
]

log = logging.getLogger(__name__)

EXPORTS_FILE = "langfuse_exports.jsonl"
OTLP_PATH = "api/public/otel/v1/traces"
SCOPE = "art_langgraph"


class LangfuseConfig(BaseModel):
    """Where and how to send traces. Unset fields come from Langfuse's own environment variables."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    public_key: str | None = None
    """Project public key; default `$LANGFUSE_PUBLIC_KEY`."""
    secret_key: str | None = None
    """Project secret key; default `$LANGFUSE_SECRET_KEY`."""
    base_url: str | None = None
    """Langfuse URL; default `$LANGFUSE_BASE_URL`, then `$LANGFUSE_HOST`, then https://cloud.langfuse.com."""
    environment: str | None = None
    """Langfuse environment of the traces; default `$LANGFUSE_TRACING_ENVIRONMENT` (Langfuse's "default" when unset)."""
    timeout_s: float = 10.0
    """Per-request timeout of an export or an API call."""
    flush_timeout_s: float = 30.0
    """How long `close()` waits for queued exports before giving up (they stay re-sendable)."""
    max_queued_batches: int = 1024
    """Batches waiting for the export thread; beyond this a batch is not sent (re-send it later)."""
    max_field_chars: int = 100_000
    """Inputs and outputs longer than this (as JSON) are cut, with a note, to keep spans under the server's limits."""
    max_request_bytes: int = 2_000_000
    """Spans per OTLP request, in encoded bytes before gzip (whole trajectories; one larger trajectory goes alone)."""

    def resolved(self) -> LangfuseConfig:
        env = os.environ.get
        return self.model_copy(
            update={
                "public_key": self.public_key or env("LANGFUSE_PUBLIC_KEY"),
                "secret_key": self.secret_key or env("LANGFUSE_SECRET_KEY"),
                "base_url": (
                    self.base_url
                    or env("LANGFUSE_BASE_URL")
                    or env("LANGFUSE_HOST")
                    or "https://cloud.langfuse.com"
                ).rstrip("/"),
                "environment": self.environment or env("LANGFUSE_TRACING_ENVIRONMENT"),
            }
        )


# ------------------------------------------------------------------ ids and URLs
def trace_id_for(trajectory: Trajectory) -> str:
    """The trace a trajectory is exported to: the one its capture linked (a user's
    CallbackHandler trace), else `Langfuse.create_trace_id(seed=trajectory.id)`."""
    linked = trajectory.metadata.get("langfuse_linked_trace_id")
    if isinstance(linked, str) and len(linked) == 32:
        return linked
    return Langfuse.create_trace_id(seed=trajectory.id)


def _span_id(trace_id: str, key: str) -> int:
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


@dataclass
class _Batch:
    run: RunInfo
    step: int
    split: str
    groups: list[TrajectoryGroup]
    trajectories: int = 0


@dataclass
class _SpanBuilder:
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
        span_id = _span_id(trace_id, key)
        tid = int(trace_id, 16)
        ctx = SpanContext(tid, span_id, is_remote=False, trace_flags=TraceFlags(1))
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
        return span_id

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
            "model": f"{self.run.name}@{self.step}",
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
            "langfuse.observation.model.name": call.model or f"{self.run.name}@{self.step}",
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


def _attr(value: Any) -> Any:
    """An OpenTelemetry attribute value: str/bool/int/float as is, the rest as JSON."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return json.dumps(value, default=str)


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


# ------------------------------------------------------------------ sending
@dataclass
class ExportReport:
    """What one export sent."""

    batches: int = 0
    trajectories: int = 0
    spans: int = 0
    scores: int = 0
    failed_batches: list[tuple[str, int]] = field(default_factory=list)
    """(split, step) of batches that did not get through."""
    evaluations: int = 0
    """Held-out evaluations (dataset runs, langfuse_datasets.py) re-sent by `export_folder`."""
    failed_evaluations: list[str] = field(default_factory=list)
    """Run names of recorded evaluations that still did not get through."""
    review_items: int = 0
    """Rollouts picked for review and recorded as unsent, now in their queue (langfuse_review.py)."""
    review_unsent: int = 0
    """Such rollouts that still did not get through."""


class _Sender:
    """Posts spans (OTLP/HTTP protobuf, gzip) and scores (SDK API client) to one Langfuse."""

    def __init__(self, config: LangfuseConfig) -> None:
        self.config = config
        if not (config.public_key and config.secret_key):
            raise UsageError(
                "Langfuse needs a public and a secret key: pass them, or set "
                "LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY"
            )
        auth = base64.b64encode(f"{config.public_key}:{config.secret_key}".encode()).decode()
        self.headers = {
            "Authorization": f"Basic {auth}",
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "gzip",
            "x-langfuse-sdk-name": "python",
            "x-langfuse-public-key": config.public_key,
            "x-langfuse-ingestion-version": "4",
        }
        self.http = httpx.Client(timeout=config.timeout_s)
        self.api = LangfuseAPI(
            base_url=str(config.base_url),
            username=config.public_key,
            password=config.secret_key,
            x_langfuse_public_key=config.public_key,
            x_langfuse_sdk_name="python",
            timeout=config.timeout_s,
        )
        self._project_id: str | None = None
        self._config_ids: dict[str, str] | None = None

    def config_ids(self) -> dict[str, str]:
        """Score config ids by name (langfuse_scoring.py), created or looked up once."""
        if self._config_ids is None:
            self._config_ids = ensure_score_configs(self.api)
        return self._config_ids

    def project_id(self) -> str | None:
        if self._project_id is None:
            projects = self.api.projects.get(request_options={"max_retries": 0}).data
            self._project_id = projects[0].id if projects else None
        return self._project_id

    def trace_url(self, trace_id: str) -> str:
        """The trace's page; `/trace/{id}` (Langfuse redirects it) while the project is unknown."""
        pid = self._project_id
        base = self.config.base_url
        return f"{base}/project/{pid}/traces/{trace_id}" if pid else f"{base}/trace/{trace_id}"

    def send(self, batch: _Batch) -> tuple[int, int]:
        """Post a batch's spans in requests of at most `max_request_bytes` (whole
        trajectories each), then its scores, 100 per request (the SDK's own batching)."""
        builder = _SpanBuilder(self.config, batch.run, batch.step, batch.split)
        sent: list[Trajectory] = []
        chunk: list[ReadableSpan] = []
        chunk_bytes = 0
        for gi, group in enumerate(batch.groups):
            for t in group.trajectories:
                first = len(builder.spans)
                builder.trajectory(t, gi, group)
                sent.append(t)
                spans = builder.spans[first:]
                size = encode_spans(spans).ByteSize()
                if chunk and chunk_bytes + size > self.config.max_request_bytes:
                    self._post_spans(chunk)
                    chunk, chunk_bytes = [], 0
                chunk.extend(spans)
                chunk_bytes += size
        if chunk:
            self._post_spans(chunk)
        config_ids = self.config_ids()  # after the spans: a config clash leaves the traces sent
        env = self.config.environment
        scores = [s for t in sent for s in score_bodies(t, env, config_ids)]
        for i in range(0, len(scores), 100):
            self.api.scores.create(
                request=scores[i : i + 100],  # type: ignore[arg-type]
                request_options={"max_retries": 0},
            )
        return len(builder.spans), len(scores)

    def _post_spans(self, spans: list[ReadableSpan]) -> None:
        body = gzip.compress(encode_spans(spans).SerializeToString(), mtime=0)
        r = self.http.post(
            f"{self.config.base_url}/{OTLP_PATH}", content=body, headers=self.headers
        )
        if r.status_code >= 300:
            raise RuntimeError(f"OTLP export answered {r.status_code}: {r.text[:200]}")

    def close(self) -> None:
        self.http.close()


def _annotate(sender: _Sender, groups: Iterable[TrajectoryGroup]) -> int:
    n = 0
    for g in groups:
        for t in g.trajectories:
            trace_id = trace_id_for(t)
            t.metadata["langfuse_trace_id"] = trace_id
            t.metadata["langfuse_trace_url"] = sender.trace_url(trace_id)
            n += 1
    return n


def _record_export(folder: Path | None, batch: _Batch, spans: int, scores: int) -> None:
    if folder is None:
        return
    line = {
        "split": batch.split,
        "step": batch.step,
        "trajectories": batch.trajectories,
        "spans": spans,
        "scores": scores,
        "time": time.time(),
    }
    with open(folder / EXPORTS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


class LangfuseLogger:
    """Exports every trajectory a backend records to Langfuse, on a background thread.

    `LangfuseLogger()` reads `LANGFUSE_PUBLIC_KEY`, `LANGFUSE_SECRET_KEY` and
    `LANGFUSE_BASE_URL`; pass a `LangfuseConfig` or its fields to override them."""

    def __init__(self, config: LangfuseConfig | None = None, **fields: Any) -> None:
        self.config = (config or LangfuseConfig(**fields)).resolved()
        self.sender = _Sender(self.config)
        self.report = ExportReport()
        self._queue: queue.Queue[_Batch | None] = queue.Queue(self.config.max_queued_batches)
        self._warned = False
        self._lock = threading.Lock()
        self._project_looked_up = threading.Event()
        self._thread = threading.Thread(target=self._work, name="langfuse-export", daemon=True)
        self._thread.start()

    # the TrajectoryLogger protocol
    def log_trajectories(
        self, run: RunInfo, step: int, split: str, groups: list[TrajectoryGroup]
    ) -> None:
        # The trace URLs name the project: wait (once, briefly) for its lookup to finish.
        self._project_looked_up.wait(timeout=min(2.0, self.config.timeout_s))
        n = _annotate(self.sender, groups)
        batch = _Batch(run, step, split, [g.model_copy(deep=True) for g in groups], n)
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._fail(batch, RuntimeError("the export queue is full"))

    def log_metrics(self, run: RunInfo, step: int, split: str, metrics: dict[str, float]) -> None:
        """Langfuse keeps traces and scores, not step metrics: nothing to send."""

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until queued batches are sent (or failed); False on timeout."""
        deadline = time.monotonic() + (timeout_s or self.config.flush_timeout_s)
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        if not self.flush():
            log.warning(
                "Langfuse: %d batches were not sent within %.0f s; re-send them with "
                "`art-langgraph langfuse export MODEL_DIR`",
                self._queue.unfinished_tasks,
                self.config.flush_timeout_s,
            )
        self._queue.put(None)
        self._thread.join(timeout=1)
        self.sender.close()

    def _work(self) -> None:
        try:
            self.sender.project_id()
        except Exception as exc:
            log.debug("Langfuse: no project id (%s); trace URLs use /trace/{id}", exc)
        self._project_looked_up.set()
        while (batch := self._queue.get()) is not None:
            try:
                spans, scores = self.sender.send(batch)
                with self._lock:
                    self.report.batches += 1
                    self.report.trajectories += batch.trajectories
                    self.report.spans += spans
                    self.report.scores += scores
                _record_export(batch.run.folder, batch, spans, scores)
            except Exception as exc:
                self._fail(batch, exc)
            finally:
                self._queue.task_done()

    def _fail(self, batch: _Batch, exc: BaseException) -> None:
        with self._lock:
            self.report.failed_batches.append((batch.split, batch.step))
            first, self._warned = not self._warned, True
        if first:
            log.warning(
                "Langfuse export to %s failed (%s: %s). Training goes on and the trajectories "
                "JSONL keeps everything; re-send with `art-langgraph langfuse export MODEL_DIR`. "
                "Further failures are logged at debug level.",
                self.config.base_url,
                type(exc).__name__,
                exc,
            )
        else:
            log.debug("Langfuse export failed again: %s", exc)


# ------------------------------------------------------------------ re-export
def _batches(folder: Path, step: int | None) -> Iterator[tuple[str, int, Path]]:
    if folder.is_file():  # one step's file: {folder}/trajectories/{split}/{step}.jsonl
        if not (folder.stem.isdigit() and folder.parent.parent.name == "trajectories"):
            raise UsageError(
                f"{folder} is not a model's trajectories/{{split}}/{{step}}.jsonl: "
                "pass the file the backend wrote, or the model's folder"
            )
        yield folder.parent.name, int(folder.stem), folder
        return
    root = folder / "trajectories"
    if not root.is_dir():
        raise UsageError(f"{folder} has no trajectories/ folder: is it a model's folder?")
    for split_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(split_dir.glob("*.jsonl")):
            if f.stem.isdigit() and (step is None or int(f.stem) == step):
                yield split_dir.name, int(f.stem), f


def _exported(folder: Path) -> set[tuple[str, int]]:
    path = folder / EXPORTS_FILE
    if not path.exists():
        return set()
    done = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            done.add((str(rec["split"]), int(rec["step"])))
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from a kill: that batch counts as not sent
    return done


def _run_info(folder: Path) -> RunInfo:
    return RunInfo(
        name=folder.name,
        project=folder.parent.parent.name,
        base_model=recorded_base_model(folder),
        folder=folder,
    )


def export_folder(
    folder: str | Path,
    *,
    step: int | None = None,
    resend: bool = False,
    config: LangfuseConfig | None = None,
) -> ExportReport:
    """Send a model folder's trajectories to Langfuse, synchronously: the batches not yet
    recorded as exported (all of them with `resend=True`), or only `step`; or one step's
    `trajectories/{split}/{step}.jsonl` file. Idempotent."""
    source = Path(folder).resolve()
    folder = source.parents[2] if source.is_file() else source
    run = _run_info(folder)
    sender = _Sender((config or LangfuseConfig()).resolved())
    try:
        sender.project_id()
    except Exception as exc:
        log.debug("no project id: %s", exc)
    done = set() if resend or step is not None or source.is_file() else _exported(folder)
    report = ExportReport()
    try:
        for split, s, path in _batches(source, step):
            if (split, s) in done:
                continue
            groups = read_groups(path)
            batch = _Batch(run, s, split, groups, _annotate(sender, groups))
            try:
                spans, scores = sender.send(batch)
            except Exception as exc:
                report.failed_batches.append((split, s))
                log.warning("Langfuse: %s step %d not sent: %s", split, s, exc)
                continue
            write_jsonl(path, groups)  # the trace ids and URLs, written back atomically
            _record_export(folder, batch, spans, scores)
            report.batches += 1
            report.trajectories += batch.trajectories
            report.spans += spans
            report.scores += scores
        if not source.is_file():  # evaluations recorded as unsent (langfuse_datasets.py)
            from art_langgraph.integrations.langfuse_datasets import resend_evaluations

            report.evaluations, report.failed_evaluations = resend_evaluations(folder, sender)
            from art_langgraph.integrations.langfuse_review import resend_review_items

            report.review_items, report.review_unsent = resend_review_items(folder, config=config)
    finally:
        sender.close()
    return report


# ------------------------------------------------------------------ review back
class ReviewedScore(BaseModel):
    """A score read back from Langfuse."""

    id: str
    """The score's id."""
    trace_id: str | None
    """The trace it scores; None when it scores a session or an experiment."""
    name: str
    """The score's name."""
    value: float | str | bool
    """Its value, as Langfuse stores it for its data type."""
    source: str
    """ANNOTATION, API or EVAL."""
    comment: str | None = None
    """The reviewer's comment."""
    author_user_id: str | None = None
    """Who gave it (annotation scores)."""
    queue_id: str | None = None
    """The annotation queue it was given in."""
    data_type: str | None = None
    """NUMERIC, BOOLEAN, CATEGORICAL, TEXT or CORRECTION (a corrected output)."""
    observation_id: str | None = None
    """The observation it scores, when it scores one (a generation) and not a whole trace."""


class ReviewResult(BaseModel):
    """Trajectories with review scores applied as rewards, and the scores that matched nothing."""

    groups: list[TrajectoryGroup] = Field(default_factory=list)
    """Reviewed groups, rewards replaced by the scores (ready for `model.train`)."""
    applied: int = 0
    """Trajectories whose reward was replaced."""
    dropped: int = 0
    """Unreviewed trajectories left out of reviewed groups (`partial="drop"`)."""
    unmatched: list[ReviewedScore] = Field(default_factory=list)
    """Scores for traces that are not in these trajectories (never exported from here)."""
    unusable: list[ReviewedScore] = Field(default_factory=list)
    """Scores on our traces whose value is not a number (map it with `value_map`)."""


def _score_value(s: ReviewedScore, value_map: dict[str, float] | None) -> float | None:
    if isinstance(s.value, bool):
        return 1.0 if s.value else 0.0
    if isinstance(s.value, int | float):
        return float(s.value) if math.isfinite(s.value) else None
    if value_map and s.value in value_map:
        return float(value_map[s.value])
    return _CATEGORY_VALUES.get(s.name, {}).get(str(s.value))


_CATEGORY_VALUES = {c.name: dict(c.categories) for c in SCORE_CONFIGS if c.categories}
"""Our categorical configs' values (review_decision: approve 1, reject 0), for scores given
with them in a queue; a `value_map` entry overrides."""
_PRECEDENCE = {REVIEW_DECISION: 1, REVIEW_SCORE: 2}
"""Of several usable scores on one trace, the grade wins over the verdict, both over others."""


def fetch_scores(
    *,
    name: str | None = None,
    source: Literal["ANNOTATION", "API", "EVAL"] | None = None,
    queue_id: str | None = None,
    config: LangfuseConfig | None = None,
    page_size: int = 100,
    data_type: str | None = None,
) -> list[ReviewedScore]:
    """Every score matching the filters (all pages), through the SDK's v3 scores API."""
    sender = _Sender((config or LangfuseConfig()).resolved())
    out: list[ReviewedScore] = []
    cursor: str | None = None
    try:
        while True:
            page = sender.api.scores.get_many(
                name=name,
                source=source,
                queue_id=queue_id,
                data_type=data_type,
                fields="details,subject,annotation",
                limit=page_size,
                cursor=cursor,
            )
            for s in page.data:
                subject = getattr(s, "subject", None)
                kind = getattr(subject, "kind", None)
                trace_id = (
                    getattr(subject, "id", None)
                    if kind == "trace"
                    else getattr(subject, "trace_id", None)
                )
                out.append(
                    ReviewedScore(
                        id=s.id,
                        trace_id=trace_id,
                        name=s.name,
                        value=getattr(s, "value", None),  # type: ignore[arg-type]
                        source=str(s.source),
                        comment=s.comment,
                        author_user_id=s.author_user_id,
                        queue_id=s.queue_id,
                        data_type=str(s.data_type),
                        observation_id=getattr(subject, "id", None)
                        if kind == "observation"
                        else None,
                    )
                )
            cursor = getattr(page.meta, "cursor", None)
            if not cursor or not page.data:
                return out
    finally:
        sender.close()


def _first_copies(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """Each trajectory once, as first saved: a folder holds a trajectory again when it was
    logged for review at one step and trained at a later one."""
    seen: set[str] = set()
    out = []
    for g in groups:
        fresh = [t for t in g.trajectories if t.id not in seen]
        seen.update(t.id for t in fresh)
        if fresh:
            out.append(g.model_copy(update={"trajectories": fresh}) if len(fresh) < len(g) else g)
    return out


def import_scores(
    source_path: str | Path | list[TrajectoryGroup],
    *,
    name: str | None = None,
    source: Literal["ANNOTATION", "API", "EVAL"] | None = "ANNOTATION",
    queue_id: str | None = None,
    value_map: dict[str, float] | None = None,
    partial: Literal["drop", "keep"] = "drop",
    step: int | None = None,
    out: str | Path | None = None,
    config: LangfuseConfig | None = None,
    scores: list[ReviewedScore] | None = None,
) -> ReviewResult:
    """Review scores as rewards. `source_path`: a model folder, a trajectories JSONL file, or
    groups. Scores are fetched by `name` / `source` / `queue_id` (or given as `scores`).
    A group with at least one scored trajectory is *reviewed*: its scored trajectories take
    the score as reward (the old one is kept in `metrics["reward_before_review"]`), and its
    unscored ones are dropped (`partial="drop"`) or keep their reward ("keep"). Unreviewed
    groups are left out. `out`: also write the reviewed groups there (JSONL of groups).
    Queue reviews: `review_decision` counts approve 1 / reject 0 (unless `value_map` says
    otherwise); a trace with several scores takes `review_score`, else `review_decision`,
    else the last by id; corrections (data type CORRECTION) are not rewards and are skipped."""
    if isinstance(source_path, list):
        groups = [g.model_copy(deep=True) for g in source_path]
    else:
        p = Path(source_path)
        files = [f for _, _, f in _batches(p, step)] if p.is_dir() else [p]
        groups = _first_copies([g for f in files for g in read_groups(f)])
    if scores is None:
        scores = fetch_scores(name=name, source=source, queue_id=queue_id, config=config)
    by_trace: dict[str, Trajectory] = {}
    for g in groups:
        for t in g.trajectories:
            by_trace[str(t.metadata.get("langfuse_trace_id") or trace_id_for(t))] = t
    result = ReviewResult()
    reviewed: dict[str, ReviewedScore] = {}
    for score in sorted(scores, key=lambda s: (_PRECEDENCE.get(s.name, 0), s.id)):
        target = by_trace.get(score.trace_id or "")
        if score.data_type == "CORRECTION":
            continue  # a corrected output, not a reward: see langfuse_review.corrections_sft_file
        if target is None:
            result.unmatched.append(score)
        elif _score_value(score, value_map) is None:
            result.unusable.append(score)
        else:
            reviewed[target.id] = score
    for g in groups:
        if not any(t.id in reviewed for t in g.trajectories):
            continue
        kept = []
        for t in g.trajectories:
            given = reviewed.get(t.id)
            if given is None:
                if partial == "keep":
                    kept.append(t)
                else:
                    result.dropped += 1
                continue
            t.metrics["reward_before_review"] = t.reward
            t.reward = _score_value(given, value_map)  # type: ignore[assignment]
            t.metadata["review"] = given.model_dump(exclude_none=True)
            kept.append(t)
            result.applied += 1
        result.groups.append(g.model_copy(update={"trajectories": kept}))
    if out is not None:
        write_jsonl(out, result.groups)
    return result


def approved_sft_file(
    result: ReviewResult | Iterable[TrajectoryGroup],
    out: str | Path,
    *,
    min_reward: float = 1.0,
) -> int:
    """Write the trajectories whose (reviewed) reward is at least `min_reward` as a JSONL of
    Trajectories, which `art.read_jsonl` reads and `model.train_sft` trains on token-exactly.
    Returns how many were written."""
    groups = result.groups if isinstance(result, ReviewResult) else list(result)
    approved = [t for g in groups for t in g.trajectories if t.reward >= min_reward]
    return write_jsonl(out, approved)
