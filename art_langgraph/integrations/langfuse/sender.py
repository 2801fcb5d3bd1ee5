"""`Sender`: one connection to one Langfuse, for spans, scores and its API (extra `langfuse`).

Spans go as OTLP/HTTP protobuf, gzip, to the endpoint the SDK itself exports to
(`/api/public/otel/v1/traces`, the same headers), encoded by OpenTelemetry's OTLP encoder,
in requests of at most `max_request_bytes`. Scores, score listing, project lookup, queues
and datasets go through the SDK's API client (`Sender.api`, a `langfuse.api.LangfuseAPI`).
No `Langfuse` client is constructed, so a user's own Langfuse client and tracer provider
are untouched. Every module of the package that talks to Langfuse does it through a
`Sender`.

Left out: retries (a failed request, or a score Langfuse rejects, raises; callers record
what was not sent and `export_folder` re-sends it); building the spans (traces.py).
"""

from __future__ import annotations

import base64
import gzip
from typing import Any

import httpx

from art_langgraph.errors import UsageError
from art_langgraph.integrations.langfuse.client import NO_RETRY
from art_langgraph.integrations.langfuse.config import EXTRA_MISSING, LangfuseConfig
from art_langgraph.integrations.langfuse.scoring import ensure_score_configs, score_configs
from art_langgraph.integrations.langfuse.traces import Batch, SpanBuilder, score_bodies
from art_langgraph.trajectories.trajectory import Trajectory

try:
    from langfuse.api import LangfuseAPI
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import ReadableSpan
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(EXTRA_MISSING) from exc

OTLP_PATH = "api/public/otel/v1/traces"
"""Where spans are posted, under the Langfuse URL."""


class Sender:
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

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One plain JSON request to the public API at `path` (for what the SDK's client
        lacks: dataset run items, run listing, score listing by run)."""
        cfg = self.config
        return self.http.request(
            method,
            f"{cfg.base_url}/{path}",
            auth=(str(cfg.public_key), str(cfg.secret_key)),
            headers={"x-langfuse-sdk-name": "python", "x-langfuse-public-key": str(cfg.public_key)},
            **kwargs,
        )

    def get_json(self, path: str, params: dict[str, str] | None = None) -> Any:
        """GET a public API path as JSON; None for 404; raises on other errors (the caller
        decides)."""
        r = self.request("GET", path, params=params)
        if r.status_code == 404:
            return None
        if r.status_code >= 300:
            raise RuntimeError(f"GET /{path} answered {r.status_code}: {r.text[:200]}")
        return r.json()

    def config_ids(self) -> dict[str, str]:
        """Score config ids by name (scoring.py), created or looked up once; `reward` and
        `independent_reward` bounded to the config's `reward_range` when it is set."""
        if self._config_ids is None:
            self._config_ids = ensure_score_configs(
                self.api, score_configs(self.config.reward_range)
            )
        return self._config_ids

    def send_scores(self, bodies: list[dict[str, Any]]) -> None:
        """Post score bodies, 100 per request (the SDK's own batching). Raises when a
        request fails, and when Langfuse rejects any score of a batch (HTTP 207: a value
        its config refuses, say), so the caller records them as not sent."""
        for i in range(0, len(bodies), 100):
            res = self.api.scores.create(
                request=bodies[i : i + 100],  # type: ignore[arg-type]
                request_options=NO_RETRY,
            )
            rejected = getattr(res, "rejected", 0)
            if rejected:
                raise RuntimeError(
                    f"Langfuse rejected {rejected} scores: {getattr(res, 'errors', '')}"
                )

    def project_id(self) -> str | None:
        if self._project_id is None:
            projects = self.api.projects.get(request_options=NO_RETRY).data
            self._project_id = projects[0].id if projects else None
        return self._project_id

    def trace_url(self, trace_id: str) -> str:
        """The trace's page; `/trace/{id}` (Langfuse redirects it) while the project is unknown."""
        pid = self._project_id
        base = self.config.base_url
        return f"{base}/project/{pid}/traces/{trace_id}" if pid else f"{base}/trace/{trace_id}"

    def send(self, batch: Batch) -> tuple[int, int]:
        """Post a batch's spans in requests of at most `max_request_bytes` (whole
        trajectories each), then its scores, 100 per request (the SDK's own batching)."""
        builder = SpanBuilder(self.config, batch.run, batch.step, batch.split)
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
        self.send_scores(scores)
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
