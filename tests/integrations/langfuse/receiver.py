"""A local stand-in for a Langfuse server: the parts of its public API the SDK calls.

No Langfuse server installs from the package registries, so the tests run the real
`langfuse` SDK (and our exporter) against this receiver on a free loopback port. It
implements, as Langfuse's public API v1/v3 documents them (SDK 5.0.x):

- `POST /api/public/otel/v1/traces`: OTLP/HTTP protobuf (gzip or not), decoded with
  `opentelemetry-proto`; spans become observations keyed by span id (upserts, as
  Langfuse's ingestion does), with Langfuse's attribute mapping for type, model, usage,
  input/output, level, and trace name/tags/metadata/session;
- `POST /api/public/scores` (a JSON list, 202 `{"message": "Accepted"}`), upserted by id;
- `GET /api/public/v3/scores` with `name`, `source`, `queueId`, `traceId`, `observationId`,
  `experimentId` (a dataset run's id), `configId`, `fields`, `limit`, `cursor`;
- `GET /api/public/projects`;
- datasets, runs, score configs (SDK 5.0.x types; run items as the public API documents
  them, SDK 5 having dropped them from its client): `POST`/`GET /api/public/v2/datasets`,
  `GET /api/public/v2/datasets/{name}` (404 when missing); `POST /api/public/dataset-items`
  (upsert by id; 404 for an unknown dataset, 400 for an id of another dataset), `GET
  /api/public/dataset-items` (`datasetName`, `page`, `limit`) and `/{id}`; `POST
  /api/public/dataset-run-items` (creates the run on its first item; 404 for an unknown
  item); `GET /api/public/datasets/{name}/runs` and `/runs/{run}` (with its items); `POST`/
  `GET /api/public/score-configs` (`page`, `limit`) and `/{id}`. A score with a `configId`
  is checked against its config (type, range, categories) and rejected (HTTP 207, an
  error per score) when it does not fit, as Langfuse does; `datasetRunId` scores are kept
  like trace scores. Stricter than Langfuse, which takes scores without a config: a score
  without `configId` whose name has a score config here is rejected the same way, so no
  test passes while art_langgraph sends a score that does not reference its config.
- annotation queues and corrections: `GET`/`POST /api/public/annotation-queues` (`page`,
  `limit`; a queue names existing score configs), `GET .../{id}`; `GET`/`POST
  .../{id}/items` (`status`, `page`, `limit`), `GET`/`PATCH .../{id}/items/{item}` (status
  PENDING/COMPLETED); the v3 score list also filters by `dataType` and gives observation
  scores an observation subject. `correct()` adds a corrected output as the UI saves it (a
  CORRECTION score named "output", on a generation or the trace).

Every route checks Basic auth against the keys it was built with. `fail_with = 500`
makes every route fail, for the fail-soft tests; `delay_s = 2.0` makes every request wait
that long before it is handled (then handled as usual), for the slow-Langfuse tests.
`annotate()` adds a score as a human would in the UI (source ANNOTATION). Left out: everything else Langfuse does.
"""

from __future__ import annotations

import asyncio
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


def base_url(handle: Any) -> str:
    """The receiver's URL, from the handle of the server it runs in."""
    return f"http://127.0.0.1:{handle.port}"


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
    delay_s: float = 0.0
    observations: dict[str, dict[str, Any]] = field(default_factory=dict)
    traces: dict[str, dict[str, Any]] = field(default_factory=dict)
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    span_posts: int = 0
    # datasets, runs, score configs (by id; datasets by name)
    score_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    dataset_items: dict[str, dict[str, Any]] = field(default_factory=dict)
    dataset_runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    dataset_run_items: list[dict[str, Any]] = field(default_factory=list)
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
        complete: bool = False,
    ) -> str:
        """A score given by hand; `complete`: the reviewer then marks the trace's item in
        `queue_id` completed ("Complete + next")."""
        if complete:
            for item in self.queue_items.values():
                if item["queueId"] == queue_id and item["objectId"] == trace_id:
                    item["status"] = "COMPLETED"
                    item["completedAt"] = datetime.now(UTC).isoformat()
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
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
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
            errors = []
            for i, s in enumerate(body if isinstance(body, list) else [body]):
                if (why := self.score_config_error(s)) is not None:
                    errors.append({"index": i, "id": s.get("id"), "message": why})
                    continue
                self.scores[s["id"]] = {**s, "source": "API"}
            if errors:
                n = len(body) if isinstance(body, list) else 1
                return JSONResponse(
                    {"accepted": n - len(errors), "rejected": len(errors), "errors": errors},
                    status_code=207,
                )
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
                and all(
                    not q.get(param) or s.get(key) == q[param]
                    for param, key in (
                        ("traceId", "traceId"),
                        ("observationId", "observationId"),
                        ("experimentId", "datasetRunId"),
                        ("configId", "configId"),
                    )
                )
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
                        if s.get("traceId")
                        else {"kind": "experiment", "id": s.get("datasetRunId")}
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

        self.dataset_routes(app)
        self.queue_routes(app)
        return app

    # --- datasets, runs, score configs ------------------------------------------------
    def score_config_error(self, s: dict[str, Any]) -> str | None:
        """Why Langfuse would reject a score against its `configId`; None when it fits. A
        score without one is refused when a config of its name exists (see the module doc)."""
        if not s.get("configId"):
            named = sorted(
                c["id"] for c in self.score_configs.values() if c["name"] == s.get("name")
            )
            if named:
                return (
                    f"score {s.get('name')!r} has no configId, but its score config exists "
                    f"({', '.join(named)}): reference it"
                )
            return None
        c = self.score_configs.get(s["configId"])
        if c is None:
            return f"score config {s['configId']} not found"
        if c["isArchived"]:
            return "score config is archived"
        if s.get("name") != c["name"]:
            return f"score name {s.get('name')!r} does not match config {c['name']!r}"
        if s.get("dataType", c["dataType"]) != c["dataType"]:
            return f"dataType {s.get('dataType')} does not match config {c['dataType']}"
        value = s.get("value")
        if c["dataType"] == "NUMERIC":
            lo, hi = c.get("minValue"), c.get("maxValue")
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                return f"value {value} outside [{lo}, {hi}]"
        if c["dataType"] == "BOOLEAN" and value not in (0, 1):
            return f"value {value} is not boolean"
        if c["dataType"] == "CATEGORICAL":
            allowed = {x["value"] for x in c.get("categories") or []}
            allowed |= {x["label"] for x in c.get("categories") or []}
            if value not in allowed:
                return f"value {value!r} is not a category of {c['name']}"
        return None

    def add_score_config(self, body: dict[str, Any]) -> dict[str, Any]:
        now = datetime.now(UTC).isoformat()
        cid = f"cfg-{len(self.score_configs) + 1}"
        categories = body.get("categories")
        if body["dataType"] == "BOOLEAN":
            categories = [{"label": "True", "value": 1}, {"label": "False", "value": 0}]
        self.score_configs[cid] = {
            "id": cid,
            "name": body["name"],
            "createdAt": now,
            "updatedAt": now,
            "projectId": PROJECT_ID,
            "dataType": body["dataType"],
            "isArchived": bool(body.get("isArchived", False)),
            "minValue": body.get("minValue"),
            "maxValue": body.get("maxValue"),
            "categories": categories,
            "description": body.get("description"),
        }
        return self.score_configs[cid]

    def add_dataset(self, name: str, metadata: Any = None, description: str | None = None) -> None:
        now = datetime.now(UTC).isoformat()
        old = self.datasets.get(name)
        self.datasets[name] = {
            "id": old["id"] if old else f"ds-{len(self.datasets) + 1}",
            "name": name,
            "description": description
            if description is not None
            else (old or {}).get("description"),
            "metadata": metadata if metadata is not None else (old or {}).get("metadata"),
            "projectId": PROJECT_ID,
            "createdAt": old["createdAt"] if old else now,
            "updatedAt": now,
        }

    def run_items(self, dataset: str, run: str) -> list[dict[str, Any]]:
        return [
            r
            for r in self.dataset_run_items
            if r["datasetRunName"] == run
            and self.dataset_runs[r["datasetRunId"]]["datasetName"] == dataset
        ]

    def dataset_routes(self, app: FastAPI) -> None:
        def page(rows: list[dict[str, Any]], request: Request) -> dict[str, Any]:
            q = request.query_params
            p, limit = int(q.get("page") or 1), int(q.get("limit") or 50)
            total = len(rows)
            return {
                "data": rows[(p - 1) * limit : p * limit],
                "meta": {
                    "page": p,
                    "limit": limit,
                    "totalItems": total,
                    "totalPages": max(1, -(-total // limit)),
                },
            }

        def missing(what: str) -> Response:
            return JSONResponse({"message": f"{what} not found"}, status_code=404)

        @app.post("/api/public/score-configs")
        async def create_score_config(request: Request) -> Response:
            return JSONResponse(self.add_score_config(await request.json()))

        @app.get("/api/public/score-configs")
        async def list_score_configs(request: Request) -> Response:
            return JSONResponse(page(list(self.score_configs.values()), request))

        @app.get("/api/public/score-configs/{config_id}")
        async def get_score_config(config_id: str) -> Response:
            c = self.score_configs.get(config_id)
            return JSONResponse(c) if c else missing("score config")

        @app.post("/api/public/v2/datasets")
        async def create_dataset(request: Request) -> Response:
            body = await request.json()
            self.add_dataset(body["name"], body.get("metadata"), body.get("description"))
            return JSONResponse(self.datasets[body["name"]])

        @app.get("/api/public/v2/datasets")
        async def list_datasets(request: Request) -> Response:
            return JSONResponse(page(list(self.datasets.values()), request))

        @app.get("/api/public/v2/datasets/{name}")
        async def get_dataset(name: str) -> Response:
            d = self.datasets.get(name)
            return JSONResponse(d) if d else missing("dataset")

        @app.post("/api/public/dataset-items")
        async def create_dataset_item(request: Request) -> Response:
            body = await request.json()
            ds = self.datasets.get(body["datasetName"])
            if ds is None:
                return missing("dataset")
            iid = body.get("id") or f"item-{len(self.dataset_items) + 1}"
            old = self.dataset_items.get(iid)
            if old is not None and old["datasetName"] != ds["name"]:
                return JSONResponse(
                    {"message": f"item {iid} belongs to another dataset"}, status_code=400
                )
            now = datetime.now(UTC).isoformat()
            self.dataset_items[iid] = {
                "id": iid,
                "status": body.get("status") or "ACTIVE",
                "input": body.get("input"),
                "expectedOutput": body.get("expectedOutput"),
                "metadata": body.get("metadata"),
                "sourceTraceId": body.get("sourceTraceId"),
                "sourceObservationId": body.get("sourceObservationId"),
                "datasetId": ds["id"],
                "datasetName": ds["name"],
                "createdAt": old["createdAt"] if old else now,
                "updatedAt": now,
                "mediaReferences": [],
            }
            return JSONResponse(self.dataset_items[iid])

        @app.get("/api/public/dataset-items")
        async def list_dataset_items(request: Request) -> Response:
            name = request.query_params.get("datasetName")
            rows = [i for i in self.dataset_items.values() if not name or i["datasetName"] == name]
            return JSONResponse(page(rows, request))

        @app.get("/api/public/dataset-items/{item_id}")
        async def get_dataset_item(item_id: str) -> Response:
            i = self.dataset_items.get(item_id)
            return JSONResponse(i) if i else missing("dataset item")

        @app.post("/api/public/dataset-run-items")
        async def create_dataset_run_item(request: Request) -> Response:
            body = await request.json()
            item = self.dataset_items.get(body["datasetItemId"])
            if item is None:
                return missing("dataset item")
            if not (body.get("traceId") or body.get("observationId")):
                return JSONResponse({"message": "traceId or observationId"}, status_code=400)
            now = datetime.now(UTC).isoformat()
            run = next(
                (
                    r
                    for r in self.dataset_runs.values()
                    if r["name"] == body["runName"] and r["datasetId"] == item["datasetId"]
                ),
                None,
            )
            if run is None:
                rid = f"run-{len(self.dataset_runs) + 1}"
                run = self.dataset_runs[rid] = {
                    "id": rid,
                    "name": body["runName"],
                    "description": body.get("runDescription"),
                    "metadata": body.get("metadata"),
                    "datasetId": item["datasetId"],
                    "datasetName": item["datasetName"],
                    "createdAt": now,
                    "updatedAt": now,
                }
            row = {
                "id": f"runitem-{len(self.dataset_run_items) + 1}",
                "datasetRunId": run["id"],
                "datasetRunName": run["name"],
                "datasetItemId": item["id"],
                "traceId": body.get("traceId"),
                "observationId": body.get("observationId"),
                "createdAt": now,
                "updatedAt": now,
            }
            self.dataset_run_items.append(row)
            return JSONResponse(row)

        @app.get("/api/public/datasets/{name}/runs")
        async def list_dataset_runs(name: str, request: Request) -> Response:
            if name not in self.datasets:
                return missing("dataset")
            rows = [r for r in self.dataset_runs.values() if r["datasetName"] == name]
            return JSONResponse(page(rows, request))

        @app.get("/api/public/datasets/{name}/runs/{run_name}")
        async def get_dataset_run(name: str, run_name: str) -> Response:
            run = next(
                (
                    r
                    for r in self.dataset_runs.values()
                    if r["datasetName"] == name and r["name"] == run_name
                ),
                None,
            )
            if run is None:
                return missing("dataset run")
            return JSONResponse({**run, "datasetRunItems": self.run_items(name, run_name)})

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
