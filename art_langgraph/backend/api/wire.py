"""The training API's wire format: what `RemoteBackend` sends and the backend server answers.

Every body is JSON (never a pickle), gzip-compressed when large (`Content-Encoding:
gzip`): trajectory groups compress about 5-10x, being token ids and repeated prompts.
A train call answers a stream of JSON lines (`StepEvent`): `accepted`, then `progress`
while the step runs, `heartbeat` every few seconds, and `result` or `error` last.

The `Idempotency-Key` header makes a train call idempotent: the client derives it from
the model, the step it trains from and the encoded body (serialized once), so a retry after a lost connection (or a backend
killed mid-step and restarted) trains the step once.

Left out: the OpenAI endpoint (it is the same `/v1` as the embedded server's).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from art_langgraph.errors import UsageError
from art_langgraph.runtime.names import check_path_name
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.trajectories.trajectory import Trajectory, TrajectoryGroup

PREFIX = "/art/v1"
"""Where the training API lives; `/v1` is the OpenAI endpoint beside it."""

_GZIP_ABOVE = 16 * 1024


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Wire):
    """A model as the backend needs it: enough to rebuild it on the other side."""

    name: str
    project: str
    base_model: str
    trainable: bool
    training: ModelConfig | None = Field(
        None, description="The LoRA and run settings (trainable only)."
    )

    @field_validator("name", "project")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        check_path_name(value, "name")  # it names a folder on the server
        return value

    @classmethod
    def of(cls, model: Any) -> ModelSpec:
        settings = getattr(model, "training", None) if model.trainable else None
        return cls(
            name=model.name,
            project=model.project,
            base_model=model.base_model,
            trainable=model.trainable,
            training=settings if isinstance(settings, ModelConfig) else None,
        )

    def build(self) -> HeldModel:
        """The model as the server's backend holds it (names were checked on parsing)."""
        return HeldModel(
            name=self.name,
            project=self.project,
            base_model=self.base_model,
            is_trainable=self.trainable,
            training=self.training or ModelConfig(),
        )


@dataclass
class HeldModel:
    """A client's model as the training API's server holds it: the `ModelRef` the backend
    sees (a `TrainableModelRef` when trainable), so the server needs no `art_langgraph.model`
    (which sits above the backends)."""

    name: str
    project: str
    base_model: str
    is_trainable: bool
    training: ModelConfig
    inference_base_url: str | None = None
    inference_api_key: str | None = None

    @property
    def trainable(self) -> bool:
        return self.is_trainable


class TrainRequest(_Wire):
    model: ModelSpec
    groups: list[TrajectoryGroup]
    config: TrainConfig


class SFTItem(_Wire):
    """One SFT example, tagged (a conversation dict could otherwise parse as a Trajectory)."""

    trajectory: Trajectory | None = None
    conversation: list[dict[str, Any]] | dict[str, Any] | None = None
    """A list of messages, or `{"messages": [...], "tools": [...]}`."""

    @classmethod
    def of(cls, item: Any) -> SFTItem:
        if isinstance(item, Trajectory):
            return cls(trajectory=item)
        return cls(conversation=item)

    def value(self) -> Any:
        return self.trajectory if self.trajectory is not None else self.conversation


class SFTRequest(_Wire):
    model: ModelSpec
    items: list[SFTItem]
    config: TrainConfig
    epochs: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    stop_loss: float | None = Field(None, ge=0)


class LogRequest(_Wire):
    model: ModelSpec
    groups: list[TrajectoryGroup]
    split: str


class DeleteRequest(_Wire):
    model: ModelSpec
    metric: str
    keep_last: int


class EvaluationRequest(_Wire):
    """`record_evaluation`: a step's held-out score; the answer is a `PromotionDecision`."""

    model: ModelSpec
    step: int
    score: float


class StepEvent(_Wire):
    """One line of a train call's answer."""

    type: Literal["accepted", "progress", "heartbeat", "result", "error"]
    stage: str | None = None
    """progress: the trainer's stage name (the `ProgressFn`'s first argument)."""
    data: dict[str, Any] = Field(default_factory=dict)
    """progress: the stage's numbers; accepted: `request_id`; result: `step` and `metrics`;
    error: `message` and `kind` (the exception class, e.g. `UsageError`)."""


IDEMPOTENCY_HEADER = "idempotency-key"
"""The header that names a train call (the IETF draft's name for it)."""

_KEY = re.compile(r"^[0-9a-f]{16,64}$")


def idempotency_key(spec: ModelSpec, from_step: int, body: bytes) -> str:
    """The key of one train call: the same model, starting step and body give the same key."""
    h = hashlib.sha256()
    h.update(spec.model_dump_json().encode())
    h.update(str(from_step).encode())
    h.update(hashlib.sha256(body).digest())
    return h.hexdigest()[:32]


def check_idempotency_key(value: str | None) -> str:
    """The header's value, or a UsageError (it names a job, so it is checked like a name)."""
    if value is None or not _KEY.match(value):
        raise UsageError(f"the {IDEMPOTENCY_HEADER} header must be 16-64 hex digits, got {value!r}")
    return value


def encode_body(body: BaseModel | dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """JSON bytes (gzip above 16 KiB) and the headers that say so."""
    raw = (
        body.model_dump_json().encode()
        if isinstance(body, BaseModel)
        else json.dumps(body, allow_nan=False).encode()
    )
    headers = {"content-type": "application/json"}
    if len(raw) > _GZIP_ABOVE:
        raw = gzip.compress(
            raw, compresslevel=1, mtime=0
        )  # same body, same bytes (the key hashes them)
        headers["content-encoding"] = "gzip"
    return raw, headers


def decode_body(raw: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The JSON bytes of a request body, gunzipped (never past `max_bytes`: a gzip bomb is
    refused, not expanded)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return raw
    if encoding != "gzip":
        raise UsageError(f"unsupported Content-Encoding {encoding!r} (use gzip or none)")
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise UsageError(f"the body is not valid gzip: {exc}") from None
    if len(out) > max_bytes or d.unconsumed_tail:
        raise _TooLarge(max_bytes)
    if not d.eof:
        raise UsageError("the gzip body is truncated")
    return out


class _TooLarge(UsageError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the decompressed body is larger than {limit} bytes")
        self.limit = limit


BodyTooLarge = _TooLarge
