"""A local stand-in for a Langfuse server: the parts of its public API the SDK calls.

No Langfuse server installs from the package registries, so the tests run the real
`langfuse` SDK (and our exporter) against this receiver on a free loopback port. It
implements, as Langfuse's public API v1/v3 documents them (SDK 5.0.x):

- `POST /api/public/otel/v1/traces`: OTLP/HTTP protobuf (gzip or not), decoded with
  `opentelemetry-proto`; spans become observations keyed by span id (upserts, as
  Langfuse's ingestion does), with Langfuse's attribute mapping for type, model, usage,
  input/output, level, and trace name/tags/metadata/session;
- `POST /api/public/scores` (a JSON list, 202 `{"message": "Accepted"}`), upserted by id;
- `GET /api/public/v3/scores` with `name`, `source`, `queueId`, `fields`, `limit`, `cursor`;
- `GET /api/public/projects`;
- annotation queues and corrections: `GET`/`POST /api/public/annotation-queues` (`page`,
  `limit`; a queue names existing score configs), `GET .../{id}`; `GET`/`POST
  .../{id}/items` (`status`, `page`, `limit`), `GET`/`PATCH .../{id}/items/{item}` (status
  PENDING/COMPLETED); the v3 score list also filters by `dataType` and gives observation
  scores an observation subject. `correct()` adds a corrected output as the UI saves it (a
  CORRECTION score named "output", on a generation or the trace).

Every route checks Basic auth against the keys it was built with. `fail_with = 500`
makes every route fail, for the fail-soft tests. `annotate()` adds a score as a human
would in the UI (source ANNOTATION). Left out: everything else Langfuse does.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PROJECT_ID = "proj-test"


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _maybe_json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


@dataclass
class Receiver:
    public_key: str = "pk-test"
    secret_key: str = "sk-test"
    fail_with: int | None = None
    observations: dict[str, dict[str, Any]] = field(default_factory=dict)
    traces: dict[str, dict[str, Any]] = field(default_factory=dict)
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    span_posts: int = 0
    # annotation queues and their items (by id)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    queue_items: dict[str, dict[str, Any]] = field(default_factory=dict)

    def _authorized(self, request: Request) -> bool:
        want = base64.b64encode(f"{self.public_key}:{self.secret_key}".encode()).decode()
        return request.headers.get("authorization") == f"Basic {want}"

    def ingest_spans(self, raw: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(raw)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    attrs = {kv.key: _value(kv.value) for kv in span.attributes}
                    trace_id, span_id = span.trace_id.hex(), span.span_id.hex()
                    usage = _maybe_json(attrs.get("langfuse.observation.usage_details"))
                    self.observations[span_id] = {
                        "id": span_id,
                        "trace_id": trace_id,
                        "parent_id": span.parent_span_id.hex() or None,
                        "name": span.name,
                        "type": str(attrs.get("langfuse.observation.type", "span")).upper(),
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "model": attrs.get("langfuse.observation.model.name"),
                        "model_parameters": _maybe_json(
                            attrs.get("langfuse.observation.model.parameters")
                        ),
                        "usage": usage,
                        "input": _maybe_json(attrs.get("langfuse.observation.input")),
                        "output": _maybe_json(attrs.get("langfuse.observation.output")),
                        "level": attrs.get("langfuse.observation.level", "DEFAULT"),
                        "status_message": attrs.get("langfuse.observation.status_message"),
                        "metadata": {
                            k.removeprefix("langfuse.observation.metadata."): _maybe_json(v)
                            for k, v in attrs.items()
                            if k.startswith("langfuse.observation.metadata.")
                        },
                        "scope": ss.scope.name,
                    }
                    trace = self.traces.setdefault(
                        trace_id, {"id": trace_id, "tags": [], "metadata": {}}
                    )
                    if "langfuse.trace.name" in attrs:
                        trace["name"] = attrs["langfuse.trace.name"]
                    if "session.id" in attrs:
                        trace["session_id"] = attrs["session.id"]
                    for tag in attrs.get("langfuse.trace.tags") or []:
                        if tag not in trace["tags"]:
                            trace["tags"].append(tag)
                    for k, v in attrs.items():
                        if k.startswith("langfuse.trace.metadata."):
                            trace["metadata"][k.removeprefix("langfuse.trace.metadata.")] = (
                                _maybe_json(v)
                            )

    def annotate(
        self,
        trace_id: str,
        name: str,
        value: float | bool | str,
        *,
        comment: str | None = None,
        source: str = "ANNOTATION",
        queue_id: str | None = None,
        score_id: str | None = None,
    ) -> str:
        sid = score_id or f"human-{len(self.scores)}"
        data_type = (
            "BOOLEAN"
            if isinstance(value, bool)
            else "CATEGORICAL"
            if isinstance(value, str)
            else "NUMERIC"
        )
        self.scores[sid] = {
            "id": sid,
            "traceId": trace_id,
            "name": name,
            "value": value,
            "comment": comment,
            "dataType": data_type,
            "source": source,
            "queueId": queue_id,
            "authorUserId": "reviewer-1" if source == "ANNOTATION" else None,
        }
        return sid

    def trace_observations(self, trace_id: str) -> list[dict[str, Any]]:
        return sorted(
            (o for o in self.observations.values() if o["trace_id"] == trace_id),
            key=lambda o: (o["start_ns"], o["id"]),
        )

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def guard(request: Request, call_next: Any) -> Response:
            self.requests.append(f"{request.method} {request.url.path}")
            if self.fail_with:
                return JSONResponse({"message": "injected failure"}, status_code=self.fail_with)
            if not self._authorized(request):
                return JSONResponse({"message": "unauthorized"}, status_code=401)
            return await call_next(request)  # type: ignore[no-any-return]

        @app.post("/api/public/otel/v1/traces")
        async def traces(request: Request) -> Response:
            raw = await request.body()
            if request.headers.get("content-encoding") == "gzip":
                raw = gzip.decompress(raw)
            self.ingest_spans(raw)
            self.span_posts += 1
            return Response(
                ExportTraceServiceResponse().SerializeToString(),
                media_type="application/x-protobuf",
            )

        @app.post("/api/public/scores")
        async def create_scores(request: Request) -> Response:
            body = await request.json()
            for s in body if isinstance(body, list) else [body]:
                self.scores[s["id"]] = {**s, "source": "API"}
            return JSONResponse({"message": "Accepted"}, status_code=202)

        @app.get("/api/public/v3/scores")
        async def list_scores(request: Request) -> Response:
            q = request.query_params
            fields = set((q.get("fields") or "").split(","))
            rows = [
                s
                for s in sorted(self.scores.values(), key=lambda s: s["id"])
                if (not q.get("name") or s["name"] == q["name"])
                and (not q.get("source") or s["source"] == q["source"])
                and (not q.get("queueId") or s.get("queueId") == q["queueId"])
                and (not q.get("dataType") or s.get("dataType") == q["dataType"].upper())
            ]
            limit, start = int(q.get("limit") or 50), int(q.get("cursor") or 0)
            page = rows[start : start + limit]
            now = datetime.now(UTC).isoformat()
            data = []
            for s in page:
                row: dict[str, Any] = {
                    "id": s["id"],
                    "projectId": PROJECT_ID,
                    "name": s["name"],
                    "value": s["value"],
                    "dataType": s.get("dataType") or "NUMERIC",
                    "source": s["source"],
                    "timestamp": now,
                    "environment": s.get("environment") or "default",
                    "createdAt": now,
                    "updatedAt": now,
                }
                if "details" in fields:
                    row.update(comment=s.get("comment"), metadata=s.get("metadata"))
                if "subject" in fields:
                    row["subject"] = (
                        {"kind": "observation", "id": s["observationId"], "traceId": s["traceId"]}
                        if s.get("observationId")
                        else {"kind": "trace", "id": s["traceId"]}
                    )
                if "annotation" in fields:
                    row.update(authorUserId=s.get("authorUserId"), queueId=s.get("queueId"))
                data.append(row)
            meta: dict[str, Any] = {"limit": limit}
            if start + limit < len(rows):
                meta["cursor"] = str(start + limit)
            return JSONResponse({"data": data, "meta": meta})

        @app.get("/api/public/projects")
        async def projects() -> Response:
            return JSONResponse(
                {
                    "data": [
                        {
                            "id": PROJECT_ID,
                            "name": "test",
                            "organization": {"id": "org-test", "name": "test"},
                            "metadata": {},
                        }
                    ]
                }
            )

        self.queue_routes(app)
        return app

    # --- annotation queues, corrections ------------------------------------------------
    def correct(
        self,
        trace_id: str,
        value: str,
        *,
        observation_id: str | None = None,
        queue_id: str | None = None,
        score_id: str | None = None,
    ) -> str:
        """A corrected output, as a reviewer saves it in the UI: a score of data type
        CORRECTION named "output" (Langfuse overrides the name), on a generation when
        `observation_id` is given, else on the trace."""
        sid = score_id or f"correction-{len(self.scores)}"
        self.scores[sid] = {
            "id": sid,
            "traceId": trace_id,
            "observationId": observation_id,
            "name": "output",
            "value": value,
            "comment": None,
            "dataType": "CORRECTION",
            "source": "ANNOTATION",
            "queueId": queue_id,
            "authorUserId": "reviewer-1",
        }
        return sid

    def queue_routes(self, app: FastAPI) -> None:
        """`GET`/`POST /api/public/annotation-queues` (`page`, `limit`), `GET .../{id}`;
        `GET`/`POST .../{id}/items` (`status`, `page`, `limit`), `GET`/`PATCH
        .../{id}/items/{item}` (status PENDING/COMPLETED, `completedAt` set on completion)."""

        def page(rows: list[dict[str, Any]], request: Request) -> dict[str, Any]:
            q = request.query_params
            p, limit = int(q.get("page") or 1), int(q.get("limit") or 50)
            return {
                "data": rows[(p - 1) * limit : p * limit],
                "meta": {
                    "page": p,
                    "limit": limit,
                    "totalItems": len(rows),
                    "totalPages": max(1, -(-len(rows) // limit)),
                },
            }

        def missing(what: str) -> Response:
            return JSONResponse({"message": f"{what} not found"}, status_code=404)

        @app.get("/api/public/annotation-queues")
        async def list_queues(request: Request) -> Response:
            return JSONResponse(page(list(self.queues.values()), request))

        @app.post("/api/public/annotation-queues")
        async def create_queue(request: Request) -> Response:
            body = await request.json()
            unknown = [c for c in body["scoreConfigIds"] if c not in self.score_configs]
            if unknown:
                return JSONResponse({"message": f"unknown score configs {unknown}"}, 400)
            now = datetime.now(UTC).isoformat()
            qid = f"queue-{len(self.queues) + 1}"
            self.queues[qid] = {
                "id": qid,
                "name": body["name"],
                "description": body.get("description"),
                "scoreConfigIds": list(body["scoreConfigIds"]),
                "createdAt": now,
                "updatedAt": now,
            }
            return JSONResponse(self.queues[qid])

        @app.get("/api/public/annotation-queues/{queue_id}")
        async def get_queue(queue_id: str) -> Response:
            q = self.queues.get(queue_id)
            return JSONResponse(q) if q else missing("annotation queue")

        @app.get("/api/public/annotation-queues/{queue_id}/items")
        async def list_items(queue_id: str, request: Request) -> Response:
            if queue_id not in self.queues:
                return missing("annotation queue")
            status = request.query_params.get("status")
            rows = [
                i
                for i in self.queue_items.values()
                if i["queueId"] == queue_id and (not status or i["status"] == status)
            ]
            return JSONResponse(page(rows, request))

        @app.post("/api/public/annotation-queues/{queue_id}/items")
        async def create_item(queue_id: str, request: Request) -> Response:
            if queue_id not in self.queues:
                return missing("annotation queue")
            body = await request.json()
            now = datetime.now(UTC).isoformat()
            iid = f"item-{len(self.queue_items) + 1}"
            self.queue_items[iid] = {
                "id": iid,
                "queueId": queue_id,
                "objectId": body["objectId"],
                "objectType": body["objectType"],
                "status": body.get("status") or "PENDING",
                "completedAt": None,
                "createdAt": now,
                "updatedAt": now,
            }
            return JSONResponse(self.queue_items[iid])

        @app.get("/api/public/annotation-queues/{queue_id}/items/{item_id}")
        async def get_item(queue_id: str, item_id: str) -> Response:
            i = self.queue_items.get(item_id)
            ok = i is not None and i["queueId"] == queue_id
            return JSONResponse(i) if ok else missing("annotation queue item")

        @app.patch("/api/public/annotation-queues/{queue_id}/items/{item_id}")
        async def update_item(queue_id: str, item_id: str, request: Request) -> Response:
            i = self.queue_items.get(item_id)
            if i is None or i["queueId"] != queue_id:
                return missing("annotation queue item")
            body = await request.json()
            now = datetime.now(UTC).isoformat()
            if body.get("status"):
                i["status"] = body["status"]
                i["completedAt"] = now if body["status"] == "COMPLETED" else None
            i["updatedAt"] = now
            return JSONResponse(i)
