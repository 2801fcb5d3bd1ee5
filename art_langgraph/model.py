"""`Model` (inference only) and `TrainableModel` (a LoRA adapter trained with GRPO), ART's names.

A model is registered with a backend (`await model.register(backend)`), which serves
it over an OpenAI-compatible endpoint: `model.openai_client()` points at it, and the
served name is `model.name` (the latest step) or `f"{model.name}@{step}"` (pinned).
`TrainableModel.train(groups)` runs one GRPO step and returns the new step; the
backend swaps the new adapter in before `train` returns. With
`ModelConfig.promote_on_evaluation` the bare name serves the promoted step instead
(`backend/promotion.py`; `model.record_evaluation(step, score)` decides), and the
model's own clients (`chat_model()`, `openai_client()`, `inference_name()`) ask for
`name@latest`: they are the training rollouts.

A model depends only on the `Backend` protocol (`backend/base.py`). Left out: remote
backends (a `RemoteBackend` implements the same protocol).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from art_langgraph.backend.base import Backend, TrainResult
from art_langgraph.errors import UsageError
from art_langgraph.runtime.http_pool import with_json_body
from art_langgraph.runtime.names import LATEST, check_path_name, inference_name
from art_langgraph.training.config import ModelConfig, TrainConfig

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from art_langgraph.backend.promotion import PromotionDecision
    from art_langgraph.tracing.chat_model import TrainableChatModel
    from art_langgraph.training.base import ProgressFn
    from art_langgraph.trajectories.trajectory import Trajectory, TrajectoryGroup


class Model(BaseModel):
    """A model served by a backend, for inference (evaluation, a judge, a baseline)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = Field(description="The served name; no '@' (that separates the step).")
    project: str = Field(description="Groups models on disk: {path}/{project}/models/{name}.")
    base_model: str = Field(description="A preset ('tiny'), a HF id or a local folder.")
    inference_base_url: str | None = Field(
        None, description="Set by register: the OpenAI base URL."
    )
    inference_api_key: str | None = Field(
        None, description="Set by register: the key for that URL."
    )
    _backend: Backend | None = PrivateAttr(default=None)

    def model_post_init(self, _: Any) -> None:
        check_path_name(self.name, "model name")
        check_path_name(self.project, "project")

    @property
    def trainable(self) -> bool:
        return False

    def _rollout_step(self) -> str | None:
        """What this model's own clients ask for without a step: None (the bare name), or
        `LATEST` where the bare name serves a promoted step."""
        return None

    async def register(self, backend: Backend) -> None:
        """Serve this model on `backend` (resuming from its checkpoints, if any)."""
        if not isinstance(backend, Backend):
            raise UsageError(
                f"{type(backend).__name__} is not a Backend (LocalBackend, or anything with "
                "the methods of art_langgraph.backend.base.Backend)"
            )
        await backend.register(self)
        self._backend = backend

    def backend(self) -> Backend:
        if self._backend is None:
            raise UsageError(
                f"model {self.name!r} is not registered: await model.register(backend) first"
            )
        return self._backend

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """An AsyncOpenAI client pointed at the backend (kwargs go to the client).

        Inside `art.capture()`, its chat completions are recorded with their exact token
        ids (see `openai_capture.py`), asking for token ids and logprobs unless you set them.
        With promotion on, a request naming `model.name` is sent as `name@latest` (this
        client runs the training rollouts; the app's own clients get the promoted step)."""
        from openai import AsyncOpenAI

        from art_langgraph.runtime.http_pool import shared_async_transport
        from art_langgraph.tracing.openai_capture import CapturingTransport

        self.backend()
        # Our own http_client: openai's default one closes itself from `__del__`, which can
        # unregister live sockets of other clients from the event loop (see http_pool.py).
        transport: httpx.AsyncBaseTransport = CapturingTransport(shared_async_transport())
        if self._rollout_step() is not None:
            transport = _AtLatest(transport, self.name)
        kwargs.setdefault("http_client", httpx.AsyncClient(transport=transport, timeout=None))
        return AsyncOpenAI(
            base_url=self.inference_base_url, api_key=self.inference_api_key or "local", **kwargs
        )

    def chat_model(self, step: int | None = None, **kwargs: Any) -> TrainableChatModel:
        """A LangChain chat model for this model: the latest adapter at every call (`name@latest`
        with promotion on), or `step` pinned.

        kwargs go to `langchain_openai.ChatOpenAI` (temperature, max_tokens, timeout, ...).
        """
        from art_langgraph.tracing.chat_model import build_chat_model

        self.backend()
        assert self.inference_base_url is not None
        return build_chat_model(
            name=self.name,
            step=step if step is not None else self._rollout_step(),
            base_url=self.inference_base_url,
            api_key=self.inference_api_key or "local",
            **kwargs,
        )

    def inference_name(self, step: int | None = None) -> str:
        """The model string for requests: latest (`name`, or `name@latest` with promotion
        on), or pinned to `step`."""
        return inference_name(self.name, step if step is not None else self._rollout_step())

    async def get_step(self) -> int:
        """The step served as latest (0 before any training)."""
        return await self.backend().get_step(self)

    async def log(
        self, groups: Iterable[TrajectoryGroup] | Iterable[Trajectory], split: str = "val"
    ) -> None:
        """Save trajectories under `split` for the current step and record their reward in history."""
        await self.backend().log(self, list(groups), split)


class TrainableModel(Model):
    """A model whose LoRA adapter trains with GRPO on the backend.

    `training` holds the LoRA adapter and run settings (`ModelConfig`); `config` is free for
    your own settings, as in ART (`TrainableModel(config=MyAgentConfig(...))`)."""

    training: ModelConfig = Field(
        default_factory=ModelConfig,
        description="The LoRA adapter and run settings the backend trains with.",
    )
    config: Any = Field(
        None,
        description="Your own settings for rollouts (any value; the backend never reads it).",
    )

    @model_validator(mode="before")
    @classmethod
    def _settings_given_as_config(cls, data: Any) -> Any:
        """A `ModelConfig` passed as `config` would be kept as the user's own settings and
        never trained with: refuse it, naming the field it belongs in."""
        if isinstance(data, dict) and isinstance(data.get("config"), ModelConfig):
            raise UsageError(
                "TrainableModel(config=ModelConfig(...)): the LoRA and run settings go in "
                "training=ModelConfig(...); config is for your own rollout settings, as in ART"
            )
        return data

    @property
    def trainable(self) -> bool:
        return True

    def _rollout_step(self) -> str | None:
        return LATEST if self.training.promote_on_evaluation else None

    async def train(
        self,
        groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        progress: ProgressFn | None = None,
    ) -> TrainResult:
        """One GRPO step on `groups`; returns once step N+1 is saved and served."""
        return await self.backend().train(self, list(groups), config or TrainConfig(), progress)

    async def train_sft(
        self,
        items: Iterable[Trajectory] | Iterable[list[dict[str, Any]]],
        config: TrainConfig | None = None,
        *,
        epochs: int = 1,
        batch_size: int = 8,
        stop_loss: float | None = None,
    ) -> TrainResult:
        """Supervised warm start on trajectories or conversations; one checkpoint at the end.
        With `stop_loss`, fewer than `epochs` once an epoch's last quarter of batches has a
        mean token loss at or under it; the metrics give each epoch's losses and the time."""
        return await self.backend().train_sft(
            self, list(items), config or TrainConfig(), epochs, batch_size, stop_loss=stop_loss
        )

    async def record_evaluation(self, step: int, score: float) -> PromotionDecision:
        """Record `step`'s held-out evaluation `score` and promote it (the bare name then
        serves it) if it is at least the promoted step's score minus
        `training.promotion_tolerance`; the decision is kept in the model's folder. Needs
        `ModelConfig(promote_on_evaluation=True)`."""
        return await self.backend().record_evaluation(self, step, score)

    async def delete_checkpoints(
        self, best_checkpoint_metric: str = "val/reward", keep_last: int = 1
    ) -> list[int]:
        """Keep the latest `keep_last` checkpoints and the best by `best_checkpoint_metric`; returns deleted steps."""
        return await self.backend().delete_checkpoints(self, best_checkpoint_metric, keep_last)


class _AtLatest(httpx.AsyncBaseTransport):
    """An httpx transport that sends a request naming the bare `name` as `name@latest`."""

    def __init__(self, inner: httpx.AsyncBaseTransport, name: str) -> None:
        self.inner, self.name = inner, name

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            raw = request.content if request.method == "POST" else b""
        except httpx.RequestNotRead:  # a streamed upload: not a JSON body of ours
            raw = b""
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if isinstance(body, dict) and body.get("model") == self.name:
                body["model"] = inference_name(self.name, LATEST)
                request = with_json_body(request, body)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()
