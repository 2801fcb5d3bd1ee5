"""Records of an LLM agent's rollouts for RL, in OpenPipe ART's vocabulary, stored as JSON.

`Trajectory` holds one rollout: the final conversation (OpenAI-format message dicts), every
`LLMCall` with its token ids and per-token logprobs, every `ToolEvent`, the reward and metrics.
`TrajectoryGroup` holds the rollouts of one prompt that GRPO compares with each other; like
ART's, it also takes the awaitables of rollouts still running. `LLMCall.from_openai` records a
call made with any OpenAI client, reading vLLM's `prompt_token_ids` / `token_ids` extras.
`write_jsonl` / `read_jsonl` / `append_jsonl` keep records on disk, one JSON object per line.

Left out on purpose: pickle (files must stay readable and safe to load), tokenization and chat
templates (`chat/`), advantage computation and the loss (the trainer's), and running
the awaitables of a group (`resolve` only awaits what it is given; concurrency limits live in
the caller). Floats that are not finite are written as the JSON extensions `NaN`/`Infinity`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import traceback
import uuid
from collections.abc import Awaitable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from numbers import Real
from typing import Annotated, Any, Literal, Self, TypeVar, overload

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from art_langgraph.errors import NonFiniteRewardError, UsageError
from art_langgraph.runtime.names import parse_inference_name
from art_langgraph.trajectories.plain import dump_model, plain, plain_response
from art_langgraph.trajectories.records import append_records, read_records, write_records

_M = TypeVar("_M", bound=BaseModel)
# Request kwargs that are not sampling parameters (the rest go to `LLMCall.sampling`).
_NOT_SAMPLING = frozenset(
    [
        "messages",
        "tools",
        "tool_choice",
        "model",
        "extra_headers",
        "extra_query",
        "extra_body",
        "timeout",
    ]
)

TRAIN_NODES_KEY = "art_train_nodes"
"""`Trajectory.metadata` key holding the node names `capture(train_nodes=[...])` was given
(absent for a predicate), which the trainer checks against the nodes of a whole step."""


def _new_id() -> str:
    return uuid.uuid4().hex


def _now() -> datetime:
    return datetime.now(UTC)


def sampled_logprobs(floats: list[Any] | None, content: list[Any] | None) -> list[float] | None:
    """A completion's per-token logprobs: our server's plain `token_logprobs` when present,
    else read from OpenAI's per-token objects (`logprobs.content[i].logprob`)."""
    if floats is not None:
        return [float(x) for x in floats]
    return [float(c["logprob"]) for c in content] if content is not None else None


def normalize_message(message: Any) -> dict[str, Any]:
    """An OpenAI-format chat message as a plain JSON-able dict, keys whose value is None dropped.

    Takes a dict or any object with `model_dump()` (openai / pydantic messages). Nested models
    are dumped, tuples become lists, other non-JSON values become `str(value)`.
    """
    if not isinstance(message, Mapping) and hasattr(message, "model_dump"):
        message = dump_model(message)
    if not isinstance(message, Mapping):
        raise UsageError(
            f"cannot read a chat message from {type(message).__name__}; "
            "pass a dict in OpenAI format or an object with model_dump()"
        )
    return plain(message, drop_none=True)  # type: ignore[no-any-return]


def _check_reward(trajectory_id: Any, reward: Any) -> float:
    if isinstance(reward, bool) or not isinstance(reward, Real) or not math.isfinite(reward):
        raise NonFiniteRewardError(str(trajectory_id), reward)
    return float(reward)


def _check_node_rewards(trajectory_id: Any, node_rewards: Any) -> None:
    if isinstance(node_rewards, Mapping):
        for node, reward in node_rewards.items():
            _check_reward(f"{trajectory_id} (node {node!r})", reward)


def _surface_reward_error(exc: ValidationError) -> None:
    """Re-raise a `NonFiniteRewardError` that pydantic wrapped into a ValidationError."""
    for error in exc.errors():
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, NonFiniteRewardError):
            raise cause from exc


def _normalize_messages(value: Any) -> Any:
    return [normalize_message(m) for m in value] if isinstance(value, list | tuple) else value


# OpenAI-format messages, normalized on the way in (openai objects dumped, None keys dropped).
_Messages = Annotated[list[dict[str, Any]], BeforeValidator(_normalize_messages)]
_Message = Annotated[dict[str, Any], BeforeValidator(normalize_message)]
_JSONData = Annotated[Any, BeforeValidator(plain)]


class _Record(BaseModel):
    model_config = ConfigDict(
        use_attribute_docstrings=True, extra="forbid", ser_json_inf_nan="constants"
    )


class _RewardChecked(_Record):
    """Surfaces a `NonFiniteRewardError` raised while validating nested trajectories."""

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            _surface_reward_error(exc)
            raise

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            _surface_reward_error(exc)
            raise


class FunctionCall(_Record):
    """The function part of an OpenAI tool call."""

    model_config = ConfigDict(extra="ignore")  # providers add keys; the message dict keeps them

    name: str
    """Name of the tool the model called."""
    arguments: str
    """Arguments as the JSON text the model produced (may be invalid JSON)."""


class ToolCall(_Record):
    """One tool call of an assistant message, in OpenAI format."""

    model_config = ConfigDict(extra="ignore")

    id: str
    """Id the tool result message answers with `tool_call_id`."""
    type: Literal["function"] = "function"
    """Always "function" (the only kind OpenAI chat tools have)."""
    function: FunctionCall
    """Which function, with which arguments."""

    def parsed_arguments(self) -> dict[str, Any] | str:
        """The arguments as a dict, or the raw text when they are not a JSON object."""
        try:
            parsed = json.loads(self.function.arguments)
        except ValueError:
            return self.function.arguments
        return parsed if isinstance(parsed, dict) else self.function.arguments


class LLMCall(_Record):
    """One chat-completion call: request, response, and the token view the trainer learns from."""

    type: Literal["llm_call"] = "llm_call"
    """Event kind, always "llm_call"."""
    id: str = Field(default_factory=_new_id)
    """Unique id of this call (uuid4 hex unless given)."""
    messages: _Messages = Field(default_factory=list)
    """The request messages, OpenAI format."""
    tools: list[dict[str, Any]] | None = None
    """The request's tool schemas (OpenAI format); None when the request had no tools."""
    tool_choice: Any = None
    """The request's tool_choice ("auto", "none", "required" or a dict); None when not sent."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Every other request parameter (temperature, top_p, max_tokens, stop, seed, n, extra_body keys...)."""
    response_message: _Message = Field(default_factory=dict)
    """The assistant message returned: role, content, tool_calls."""
    prompt_token_ids: list[int] | None = None
    """Token ids of the rendered prompt; None when the server did not return them."""
    completion_token_ids: list[int] | None = None
    """Token ids the model sampled; None when the server did not return them."""
    logprobs: list[float] | None = None
    """Log-probability of each completion token under the sampling policy (same length as ids)."""
    model: str | None = None
    """Served model name as returned, e.g. "agent@3"."""
    adapter_step: int | None = None
    """Training step of the adapter that sampled; parsed from `model` when it reads "name@step"."""
    finish_reason: str | None = None
    """Why generation stopped: "stop", "length", "tool_calls", ...; None when unknown."""
    latency_s: float | None = None
    """Wall time of the call in seconds; None when not measured."""
    usage: dict[str, int] | None = None
    """prompt_tokens, completion_tokens, total_tokens, and cached_tokens (OpenAI's
    `prompt_tokens_details.cached_tokens`: prompt tokens the server's prefix cache served),
    as the server reported them."""
    trainable: bool = True
    """Whether the trainer may learn from this call's completion tokens."""
    raw_response: dict[str, Any] | None = None
    """The provider's response payload, kept as sent."""
    started_at: datetime | None = None
    """When the request was sent (UTC); None when not recorded."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form JSON data for the caller."""
    node: str | None = None
    """The LangGraph node that made the call (`langgraph_node`); None outside a graph."""
    namespace: list[str] = Field(default_factory=list)
    """Node names from the root graph down to `node`, inclusive: `["research", "agent"]` for
    node "agent" of the subgraph that node "research" runs; empty outside a graph."""
    graph_step: int | None = None
    """The LangGraph superstep the call ran in (`langgraph_step`); None outside a graph."""
    thread_id: str | None = None
    """The checkpointer thread (`configurable.thread_id`); None without one."""
    checkpoint_id: str | None = None
    """The root graph's checkpoint the call's step started from: pass it as
    `configurable.checkpoint_id` (or to `art.branch`) to run again from before this call."""

    @model_validator(mode="after")
    def _check_tokens(self) -> LLMCall:
        ids, lps = self.completion_token_ids, self.logprobs
        if ids is not None and lps is not None and len(ids) != len(lps):
            raise ValueError(
                f"completion_token_ids has {len(ids)} ids but logprobs has {len(lps)} values; "
                "give one logprob per completion token (or leave logprobs None)"
            )
        if self.adapter_step is None and self.model:
            name, step = parse_inference_name(self.model)
            if name and isinstance(step, int):
                self.adapter_step = step
        return self

    @classmethod
    def from_openai(
        cls,
        request_kwargs: Mapping[str, Any],
        chat_completion: Any,
        *,
        choice_index: int = 0,
        latency_s: float | None = None,
        started_at: datetime | None = None,
    ) -> LLMCall:
        """Record a call made with `client.chat.completions.create(**request_kwargs)`.

        The one builder of a call from its request and response, as sent: the capturing
        transport (under `model.openai_client()` and `model.chat_model()` alike) comes here,
        and the LangChain callback then adds only what it knows beyond the wire (graph
        position, metadata, whether it may train).

        `chat_completion` is the returned `ChatCompletion` or a dict of its JSON, kept as
        `raw_response`. Token ids are read from vLLM's `prompt_token_ids` (top level) and
        `token_ids` (per choice) extras; logprobs from our server's `token_logprobs` extra
        (`return_token_logprobs`), else from `choice.logprobs.content[i].logprob`; logprobs
        that do not come one per token id (a provider that reports them per text piece) are
        dropped and the ids kept.
        """
        data = plain_response(chat_completion)
        if not isinstance(data, dict):
            raise UsageError(
                f"expected a ChatCompletion or dict, got {type(chat_completion).__name__}"
            )
        choices = data.get("choices") or []
        if not 0 <= choice_index < len(choices):
            raise UsageError(
                f"choice_index {choice_index} is out of range: the response has {len(choices)} choices"
            )
        choice = choices[choice_index]
        content = (choice.get("logprobs") or {}).get("content")
        usage = data.get("usage") or {}
        sampling = {
            k: v
            for k, v in request_kwargs.items()
            if k not in _NOT_SAMPLING and type(v).__name__ not in ("NotGiven", "Omit")
        }
        sampling.update(request_kwargs.get("extra_body") or {})
        tools = request_kwargs.get("tools")
        completion_ids = choice.get("token_ids")
        logprobs = sampled_logprobs(choice.get("token_logprobs"), content)
        if completion_ids is not None and logprobs is not None:
            logprobs = logprobs if len(logprobs) == len(completion_ids) else None
        return cls(
            messages=list(request_kwargs.get("messages") or []),
            tools=plain(list(tools)) if tools else None,
            tool_choice=plain(request_kwargs.get("tool_choice")),
            sampling=plain(sampling),
            response_message=choice.get("message") or {"role": "assistant"},
            prompt_token_ids=data.get("prompt_token_ids") or choice.get("prompt_token_ids"),
            completion_token_ids=completion_ids,
            logprobs=logprobs,
            model=data.get("model"),
            finish_reason=choice.get("finish_reason"),
            latency_s=latency_s,
            usage=_flat_usage(usage),
            raw_response=data,
            started_at=started_at,
        )

    @property
    def trainable_token_count(self) -> int:
        """Completion tokens the trainer can learn from: 0 when not trainable or ids are missing."""
        return len(self.completion_token_ids or []) if self.trainable else 0

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The response's tool calls as typed records."""
        return [ToolCall.model_validate(c) for c in self.response_message.get("tool_calls") or []]

    def to_messages(self) -> list[dict[str, Any]]:
        """The request messages followed by the response message (copies)."""
        return json.loads(json.dumps([*self.messages, self.response_message]))  # type: ignore[no-any-return]


class ToolEvent(_Record):
    """One tool execution: what the model asked for and what came back."""

    type: Literal["tool_event"] = "tool_event"
    """Event kind, always "tool_event"."""
    id: str = Field(default_factory=_new_id)
    """Unique id of this event (uuid4 hex unless given)."""
    name: str
    """Name of the tool that ran."""
    args: dict[str, Any] | str = Field(default_factory=dict)
    """Parsed arguments; the raw text when the model's arguments were not a JSON object."""
    tool_call_id: str | None = None
    """Id of the tool call this answers; None when the tool ran outside a tool call."""
    result: _JSONData = None
    """What the tool returned, as JSON data (non-JSON values become `str(value)`); None on error."""
    error: str | None = None
    """Error message when the tool failed; None on success."""
    latency_s: float | None = None
    """Wall time of the tool in seconds; None when not measured."""
    started_at: datetime | None = None
    """When the tool started (UTC); None when not recorded."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form JSON data for the caller."""


class ExceptionInfo(_Record):
    """An exception turned into data so it can be stored next to trajectories."""

    type: str
    """Exception class, module-qualified unless it is a builtin (e.g. "ValueError")."""
    message: str
    """`str(exception)`."""
    traceback: str = ""
    """Formatted traceback; empty when the exception was never raised."""

    @classmethod
    def from_exception(cls, exc: BaseException) -> ExceptionInfo:
        """Capture `exc` with its traceback."""
        kind = type(exc)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        return cls(type=name, message=str(exc), traceback="".join(traceback.format_exception(exc)))


class Trajectory(_RewardChecked):
    """One rollout of the agent, with its reward."""

    model_config = ConfigDict(validate_assignment=True)

    id: str = Field(default_factory=_new_id)
    """Unique id of this rollout (uuid4 hex unless given)."""
    messages: _Messages = Field(default_factory=list)
    """The final conversation, OpenAI format."""
    calls: list[LLMCall] = Field(default_factory=list)
    """Every LLM call of the rollout, in order."""
    tool_events: list[ToolEvent] = Field(default_factory=list)
    """Every tool execution of the rollout, in order."""
    reward: float = 0.0
    """Scalar reward; must be a finite number (else NonFiniteRewardError)."""
    node_rewards: dict[str, float] = Field(default_factory=dict)
    """Rewards of single LangGraph nodes, e.g. `{"router": 1.0, "agent": 0.3}`: the calls of a
    node named here train on advantages computed from these, per node within the group;
    every other call trains on `reward` (docs/langgraph.md). Each must be finite."""
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    """Named numbers to log next to the reward (not used for training)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form JSON data (scenario id, split, ...)."""
    logs: list[str] = Field(default_factory=list)
    """Free-text log lines added with `log()`."""
    exception: ExceptionInfo | None = None
    """The exception that ended the rollout; None when it finished normally."""
    interrupted: bool = False
    """True while the run waits at a LangGraph `interrupt()` (for a human's approval, say);
    resumed under `capture(thread=...)`, the same trajectory continues."""
    resume_values: list[Any] = Field(default_factory=list)
    """The values the run was resumed with (`Command(resume=...)`), in order; see
    `art.resume_reward` to turn them into a reward."""
    started_at: datetime = Field(default_factory=_now)
    """When the rollout started (UTC)."""
    finished_at: datetime | None = None
    """When `finish()` was called (UTC); None while running."""

    def __init__(self, **data: Any) -> None:
        # The reward is checked here, before pydantic, so the caller gets NonFiniteRewardError
        # itself (pydantic wraps ValueErrors raised in validators into a ValidationError).
        data.setdefault("id", _new_id())
        data["reward"] = _check_reward(data["id"], data.get("reward", 0.0))
        _check_node_rewards(data["id"], data.get("node_rewards"))
        super().__init__(**data)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "reward":
            value = _check_reward(self.id, value)
        elif name == "node_rewards":
            _check_node_rewards(self.id, value)
        super().__setattr__(name, value)

    def log(self, message: str) -> None:
        """Append a line to `logs`."""
        self.logs.append(message)

    def finish(self) -> Trajectory:
        """Set `finished_at` to now; returns self."""
        self.finished_at = _now()
        return self

    def add_call(self, call: LLMCall) -> LLMCall:
        """Append an LLM call; returns it."""
        self.calls.append(call)
        return call

    def add_tool_event(self, event: ToolEvent) -> ToolEvent:
        """Append a tool event; returns it."""
        self.tool_events.append(event)
        return event


class TrajectoryGroup(_RewardChecked):
    """The rollouts of one prompt, compared with each other by GRPO.

    `TrajectoryGroup(items)` takes trajectories, awaitables of trajectories (kept pending until
    `resolve()`), and exceptions (stored as `ExceptionInfo`), in any mix.
    """

    trajectories: list[Trajectory] = Field(default_factory=list)
    """The finished rollouts."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form JSON data (prompt id, step, ...)."""
    exceptions: list[ExceptionInfo] = Field(default_factory=list)
    """Rollouts of this group that raised instead of returning a trajectory."""
    _pending: list[Awaitable[Trajectory]] = PrivateAttr(default_factory=list)

    def __init__(self, items: Iterable[Any] | None = None, /, **data: Any) -> None:
        pending: list[Awaitable[Trajectory]] = []
        if items is not None:
            if "trajectories" in data:
                raise UsageError("pass trajectories positionally or as trajectories=, not both")
            trajectories: list[Any] = []
            exceptions = list(data.pop("exceptions", []))
            for item in items:
                if isinstance(item, BaseException):
                    exceptions.append(ExceptionInfo.from_exception(item))
                elif inspect.isawaitable(item):
                    pending.append(item)
                else:
                    trajectories.append(item)
            data.update(trajectories=trajectories, exceptions=exceptions)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            _surface_reward_error(exc)
            raise
        self._pending = pending

    def __iter__(self) -> Iterator[Trajectory]:  # type: ignore[override]
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def pending(self) -> bool:
        """True while awaitables given at construction have not been resolved."""
        return bool(self._pending)

    def awaitables(self) -> list[Awaitable[Trajectory]]:
        """The awaitables still pending (a copy; `resolve()` consumes them)."""
        return list(self._pending)

    async def resolve(self) -> TrajectoryGroup:
        """Await the pending awaitables; results join `trajectories`, failures `exceptions`."""
        pending, self._pending = self._pending, []
        for result in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(result, Trajectory):
                self.trajectories.append(result)
            elif isinstance(result, Exception):
                self.exceptions.append(ExceptionInfo.from_exception(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                raise UsageError(f"a rollout returned {type(result).__name__}, not a Trajectory")
        return self

    def rewards(self) -> list[float]:
        """The reward of each trajectory, in order."""
        return [t.reward for t in self.trajectories]

    def _check_serializable(self) -> None:
        if self._pending:
            raise UsageError(
                f"this TrajectoryGroup still has {len(self._pending)} pending awaitables; "
                "`await group.resolve()` (or gather it) before saving it"
            )

    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._check_serializable()
        return super().model_dump(*args, **kwargs)

    def model_dump_json(self, *args: Any, **kwargs: Any) -> str:
        self._check_serializable()
        return super().model_dump_json(*args, **kwargs)


def as_groups(items: Iterable[Any]) -> list[TrajectoryGroup]:
    """Groups as given, a lone Trajectory as a group of one; anything else is a UsageError."""
    groups = [g if isinstance(g, TrajectoryGroup) else TrajectoryGroup([g]) for g in items]
    if any(not isinstance(t, Trajectory) for g in groups for t in g):
        raise UsageError("expected TrajectoryGroups or Trajectories")
    return groups


def write_jsonl(path: str | os.PathLike[str], items: Iterable[BaseModel | dict[str, Any]]) -> int:
    """Write one JSON line per record (or plain dict), atomically (temp file, fsync, rename);
    returns the count (`records.write_records`)."""
    return write_records(path, items)


def append_jsonl(path: str | os.PathLike[str], item: BaseModel) -> None:
    """Append one record as a JSON line (creating the file), then flush and fsync; a line
    an earlier crash tore is cut first (`records.append_records`)."""
    append_records(path, [item])


def _groups_hint(line: str) -> str:
    if '"trajectories"' in line:
        return (
            " (this file holds TrajectoryGroups, as the backend writes them: read it with "
            "art.read_groups(path))"
        )
    return ""


@overload
def read_jsonl(path: str | os.PathLike[str]) -> list[Trajectory]: ...
@overload
def read_jsonl(path: str | os.PathLike[str], kind: type[_M]) -> list[_M]: ...
def read_jsonl(path: str | os.PathLike[str], kind: type[Any] = Trajectory) -> list[Any]:
    """Read every record of a JSON-lines file as `kind` (blank lines skipped, and a last
    line torn by a crash, with a warning: `records.read_records`)."""
    return read_records(path, kind, hint=_groups_hint if kind is Trajectory else None)


def read_groups(path: str | os.PathLike[str]) -> list[TrajectoryGroup]:
    """Read a file of TrajectoryGroups, e.g. a backend's `trajectories/{split}/{step}.jsonl`."""
    return read_jsonl(path, TrajectoryGroup)


def _flat_usage(usage: dict[str, Any]) -> dict[str, int] | None:
    """OpenAI's usage as flat counts: the integers, plus `cached_tokens` from
    `prompt_tokens_details`."""
    flat = {k: v for k, v in usage.items() if type(v) is int}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if type(cached) is int:
        flat["cached_tokens"] = cached
    return flat or None
