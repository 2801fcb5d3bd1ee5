"""`RemoteBackend(url)`: the `Backend` contract over HTTP, to a backend server on another machine.

Rollouts run in the user's process; the engine, the trainer and the checkpoints live in
`art-langgraph backend` (see `backend/api/server.py`). Changing `LocalBackend()` to
`RemoteBackend(url, api_key=...)` is the whole migration: `model.chat_model()` and
`model.openai_client()` point at the server's `/v1`, and `model.train(groups)` uploads the
groups as gzip-compressed JSON and waits for the new step, reporting progress.

A lost connection during `train` (a network blip, a backend killed and restarted) is
retried with the same idempotency key for `retry_s` seconds, then raised as
`BackendUnavailableError`; calling `train` again with the same groups is safe either way:
the id is derived from the model, the step trained from and the payload, so the backend
never trains one request twice. This module imports neither torch nor transformers.

Left out: TLS client certificates (use an https URL behind a proxy), streaming uploads.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from art_langgraph import errors
from art_langgraph.backend.api.wire import (
    IDEMPOTENCY_HEADER,
    PREFIX,
    DeleteRequest,
    EvaluationRequest,
    LogRequest,
    ModelSpec,
    SFTItem,
    SFTRequest,
    StepEvent,
    TrainRequest,
    encode_body,
    idempotency_key,
)
from art_langgraph.backend.base import ModelRef, TrainableModelRef, TrainResult, check_sft_args
from art_langgraph.backend.promotion import PromotionDecision
from art_langgraph.errors import InfrastructureError, NotRegisteredError, UsageError
from art_langgraph.trajectories.loggers import LoggerSet, RunInfo, TrajectoryLogger
from art_langgraph.trajectories.trajectory import TrajectoryGroup, as_groups

if TYPE_CHECKING:
    from art_langgraph.training.base import ProgressFn
    from art_langgraph.training.config import TrainConfig

_T = TypeVar("_T")


class BackendUnavailableError(InfrastructureError):
    """The backend server could not be reached, or the connection dropped mid-call."""


class RemoteBackend:
    """A backend server at `url` (`art-langgraph backend`). Use `async with RemoteBackend(url):`."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        retry_s: float = 0.0,
        loggers: list[TrajectoryLogger] | None = None,
    ) -> None:
        """`url`: the server's root, e.g. `http://gpu-box:8090`. `api_key`: its `--api-key`.
        `timeout_s`: connect/read timeout of short calls (a train call waits as long as the
        step runs; heartbeats keep it alive). `retry_s`: how long a train call keeps
        retrying after a lost connection before raising `BackendUnavailableError`.
        `loggers`: where trajectories and metrics also go, from this process (as
        `LocalBackend`'s; None: a `LangfuseLogger` when `LANGFUSE_*` keys are set)."""
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[: -len("/v1")]
        self.api_key = api_key
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self._steps: dict[tuple[str, str], int] = {}
        self.loggers = LoggerSet(loggers)

    async def __aenter__(self) -> RemoteBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush the loggers; the server keeps serving (and what it trained is on its disk)."""
        await asyncio.to_thread(self.loggers.close)

    # ------------------------------------------------------------------ calls
    def _client(self, timeout: httpx.Timeout) -> httpx.AsyncClient:
        from art_langgraph.runtime.http_pool import async_http_client  # shared per-loop pools

        client = async_http_client()
        client.timeout = timeout
        if self.api_key:
            client.headers["authorization"] = f"Bearer {self.api_key}"
        return client

    async def _again(self, model: ModelRef, call: Callable[[], Awaitable[_T]]) -> _T:
        """`call()`, registering `model` again once if the backend does not know it (it was
        restarted): the run resumes from the backend's last checkpoint."""
        try:
            return await call()
        except NotRegisteredError:
            await self.register(model)
            return await call()

    async def _post(self, path: str, body: Any) -> Any:
        content, headers = encode_body(body)
        async with self._client(httpx.Timeout(self.timeout_s)) as client:
            try:
                response = await client.post(
                    self.url + PREFIX + path, content=content, headers=headers
                )
            except httpx.TransportError as exc:
                raise self._unavailable(path, exc) from None
        if response.status_code != 200:
            raise _http_error(path, response.status_code, response.content)
        return response.json()

    def _unavailable(self, path: str, exc: BaseException) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the backend at {self.url} did not answer {path} ({type(exc).__name__}: {exc}); "
            "is `art-langgraph backend` running there?"
        )

    # --------------------------------------------------------------- protocol
    async def register(self, model: ModelRef) -> None:
        spec = ModelSpec.of(model)
        answer = await self._post("/register", spec)
        self._steps[(model.project, model.name)] = int(answer["step"])
        model.inference_base_url = self.url + "/v1"
        model.inference_api_key = self.api_key or "local"

    async def get_step(self, model: ModelRef) -> int:
        answer = await self._again(model, lambda: self._post("/step", ModelSpec.of(model)))
        step = int(answer["step"])
        self._steps[(model.project, model.name)] = step
        return step

    async def log(self, model: ModelRef, items: list[Any], split: str) -> None:
        groups = as_groups(items)
        step = self._steps.get((model.project, model.name), 0)
        self.loggers.trajectories(_info(model), step, split, groups)
        await self._post("/log", LogRequest(model=ModelSpec.of(model), groups=groups, split=split))

    async def delete_checkpoints(self, model: ModelRef, metric: str, keep_last: int) -> list[int]:
        body = DeleteRequest(model=ModelSpec.of(model), metric=metric, keep_last=keep_last)
        answer = await self._again(model, lambda: self._post("/delete_checkpoints", body))
        return [int(s) for s in answer["deleted"]]

    async def record_evaluation(
        self, model: TrainableModelRef, step: int, score: float
    ) -> PromotionDecision:
        body = EvaluationRequest(model=ModelSpec.of(model), step=step, score=score)
        answer = await self._again(model, lambda: self._post("/record_evaluation", body))
        return PromotionDecision.model_validate(answer)

    async def train(
        self,
        model: TrainableModelRef,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        progress: ProgressFn | None = None,
    ) -> TrainResult:
        if any(g.pending for g in groups):
            raise UsageError(
                "a group still holds pending rollouts: await art.gather_trajectory_groups(...) "
                "(or group.resolve()) before train"
            )
        step = self._steps.get((model.project, model.name), 0) + 1  # as this client knows it
        self.loggers.trajectories(_info(model), step, "train", groups)
        body = TrainRequest(model=ModelSpec.of(model), groups=groups, config=config)
        result = await self._stream(model, "/train", body, progress)
        self._steps[(model.project, model.name)] = result.step
        self.loggers.metrics(_info(model), result.step, "train", result.metrics)
        return result

    async def train_sft(
        self,
        model: TrainableModelRef,
        items: list[Any],
        config: TrainConfig,
        epochs: int,
        batch_size: int,
        *,
        stop_loss: float | None = None,
    ) -> TrainResult:
        check_sft_args(epochs, batch_size, stop_loss)
        body = SFTRequest(
            model=ModelSpec.of(model),
            items=[SFTItem.of(i) for i in items],
            config=config,
            epochs=epochs,
            batch_size=batch_size,
            stop_loss=stop_loss,
        )
        return await self._stream(model, "/train_sft", body, None)

    async def _stream(
        self,
        model: ModelRef,
        path: str,
        body: TrainRequest | SFTRequest,
        progress: ProgressFn | None,
    ) -> TrainResult:
        """Post a train call and follow its event lines; retry a lost connection by key."""
        content, headers = encode_body(body)  # serialized once: the key hashes these bytes
        from_step = self._steps.get((model.project, model.name), 0)
        key = idempotency_key(body.model, from_step, content)
        headers[IDEMPOTENCY_HEADER] = key
        deadline = time.monotonic() + self.retry_s
        timeout = httpx.Timeout(self.timeout_s, read=None)
        while True:
            try:
                result = await self._again(
                    model, lambda: self._attempt(path, content, headers, timeout, progress)
                )
            except (httpx.TransportError, _StreamCut) as exc:
                if time.monotonic() < deadline:
                    await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                    continue
                raise BackendUnavailableError(
                    f"lost the backend at {self.url} during {path} "
                    f"({type(exc).__name__}: {exc}). A step is all or nothing: call train again "
                    "with the same groups once the backend is back; it trains the step once "
                    f"(idempotency key {key})."
                ) from None
            self._steps[(model.project, model.name)] = result.step
            return result

    async def _attempt(
        self,
        path: str,
        content: bytes,
        headers: dict[str, str],
        timeout: httpx.Timeout,
        progress: ProgressFn | None,
    ) -> TrainResult:
        async with (
            self._client(timeout) as client,
            client.stream(
                "POST", self.url + PREFIX + path, content=content, headers=headers
            ) as response,
        ):
            if response.status_code != 200:
                raise _http_error(path, response.status_code, await response.aread())
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = StepEvent.model_validate_json(line)
                if event.type == "progress" and progress is not None:
                    progress(event.stage or "", event.data)
                elif event.type == "result":
                    return TrainResult.model_validate(event.data)
                elif event.type == "error":
                    raise _art_error(str(event.data.get("kind")), str(event.data.get("message")))
        raise _StreamCut("the answer ended before the step's result")


def _info(model: ModelRef) -> RunInfo:
    return RunInfo(name=model.name, project=model.project, base_model=model.base_model)


class _StreamCut(Exception):
    pass


def _art_error(kind: str, message: str) -> errors.ArtError:
    """The server's exception class by name, where it takes just a message."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.ArtError):
        try:
            return cls(message)
        except TypeError:  # a class with structured arguments: keep its family
            return (UsageError if issubclass(cls, UsageError) else InfrastructureError)(message)
    return InfrastructureError(message)


def _http_error(path: str, status: int, raw: bytes) -> errors.ArtError:
    try:
        err = json.loads(raw)["error"]
        message, kind = str(err["message"]), str(err.get("type") or "")
    except (ValueError, KeyError, TypeError):
        message, kind = raw[:300].decode("utf-8", "replace"), ""
    if status == 401:
        return UsageError(f"the backend refused the API key ({path}): {message}")
    if status in (413, 400, 404, 415):
        return _art_error(kind, message) if kind else UsageError(f"{path}: {message}")
    return InfrastructureError(f"the backend answered {status} to {path}: {message}")
