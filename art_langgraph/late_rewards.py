"""Rewards that arrive after their rollout: a human's review, a judge run elsewhere, an
outcome known only later.

The rule, in three parts:

1. **Mark, never guess.** A rollout whose reward is not known yet is marked with
   `mark_pending(traj)`. The trainer refuses a step that holds a pending trajectory
   (`check_no_pending`, called by `prepare_step`): a placeholder 0 never trains silently.
2. **Wait with a timeout, then drop.** `await wait_for_rewards(groups, fetch)` asks
   `fetch` for the pending rewards every `poll_s` seconds until all have arrived or
   `timeout_s` passed. What arrived is applied. A trajectory whose reward did not arrive
   is dropped (`on_timeout="drop"`, the default), and a group left with fewer than two
   trajectories is dropped with it (GRPO compares within a group); or, with
   `on_timeout="train_without"`, it keeps the reward it had before it was marked (a
   programmatic fallback the caller set). The default timeout is 15 minutes: Langfuse
   documents that its score and trace read APIs can lag by about 10 minutes, plus margin.
3. **After training, off-policy or not at all.** A reward that arrives after its rollout
   was trained is not applied to that step (it is over). Re-reading the saved
   trajectories with the reward (`integrations.langfuse.import_scores` on the model's
   folder) makes a new group, which trains as an off-policy update only while its
   rollouts are within `TrainConfig.max_staleness` steps; older, `prepare_step` skips it
   and counts it in `stale_groups`.

`langfuse_fetcher(...)` is a `fetch` that reads Langfuse scores (through
`integrations.langfuse.review.fetch_scores`) for the pending trajectories' traces and turns
them into rewards as `import_scores` does (review_decision approve 1 / reject 0, bool 1 / 0,
`review_score` over `review_decision`, corrections skipped). It is fail-soft: a Langfuse
that is down, slow, or answering 4xx/5xx (or a malformed page) costs a logged warning (one
per kind of error per wait) and counts as "nothing arrived yet", so the wait goes on to its
timeout and applies rule 2; `LateRewards.fetch_errors` counts those polls. Each poll's
requests are bounded by the time the wait has left (at least `MIN_POLL_S`), so a slow
server cannot hold the wait past its timeout by more than that.

Left out: pushing rewards to a waiting trainer (polling is what Langfuse's API offers),
partial credit for groups whose rewards arrive at different steps, and fail-soft for a
`fetch` of your own (an exception it raises stops the wait; misuse, such as missing
Langfuse keys, stops `langfuse_fetcher` too).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from art_langgraph.errors import UsageError
from art_langgraph.trajectory import Trajectory, TrajectoryGroup

__all__ = [
    "PENDING_KEY",
    "LateRewards",
    "check_no_pending",
    "is_pending",
    "langfuse_fetcher",
    "mark_pending",
    "wait_for_rewards",
]

logger = logging.getLogger(__name__)

PENDING_KEY = "reward_pending"
"""The trajectory metadata key that marks a reward as not known yet."""
DEFAULT_TIMEOUT_S = 900.0
"""15 minutes: Langfuse's score and trace read APIs can lag by about 10 minutes."""
MIN_POLL_S = 1.0
"""The least time one `langfuse_fetcher` poll gets, even at or past the wait's deadline."""

Fetch = Callable[[list[Trajectory]], "Mapping[str, float] | Awaitable[Mapping[str, float]]"]
"""`fetch(pending) -> {trajectory id: reward}` for the rewards that arrived (sync or async)."""


@dataclass
class _Wait:
    """The wait in progress, as `langfuse_fetcher` sees it (through `_WAIT`)."""

    deadline: float
    """`time.monotonic()` at which the wait stops polling."""
    warned: set[str] = field(default_factory=set)
    """Kinds of fetch errors already logged in this wait."""
    errors: int = 0
    """Polls whose fetch failed."""


_WAIT: contextvars.ContextVar[_Wait | None] = contextvars.ContextVar("_WAIT", default=None)


def mark_pending(traj: Trajectory) -> Trajectory:
    """Mark `traj`'s reward as not known yet; returns it."""
    traj.metadata[PENDING_KEY] = True
    return traj


def is_pending(traj: Trajectory) -> bool:
    """Whether `traj` waits for its reward."""
    return bool(traj.metadata.get(PENDING_KEY))


def check_no_pending(groups: Sequence[TrajectoryGroup]) -> None:
    """Refuse groups holding a trajectory whose reward has not arrived."""
    pending = [t.id for g in groups for t in g.trajectories if is_pending(t)]
    if pending:
        raise UsageError(
            f"{len(pending)} trajectories wait for their reward (first: {pending[0]!r}); "
            "await art.wait_for_rewards(groups, fetch) before training, which applies what "
            "arrived and drops the rest after its timeout"
        )


class LateRewards(BaseModel):
    """What `wait_for_rewards` did."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    groups: list[TrajectoryGroup] = Field(default_factory=list)
    """The groups to train: rewards applied, nothing pending left."""
    arrived: int = 0
    """Pending rewards that arrived in time."""
    missing: int = 0
    """Pending rewards that did not arrive before the timeout."""
    dropped_groups: int = 0
    """Groups left with fewer than two trajectories, dropped."""
    waited_s: float = 0.0
    """How long it waited."""
    fetch_errors: int = 0
    """Polls of `langfuse_fetcher` that failed (Langfuse down, slow, or answering an
    error) and counted as nothing arrived."""


async def wait_for_rewards(
    groups: Sequence[TrajectoryGroup],
    fetch: Fetch,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = 30.0,
    on_timeout: Literal["drop", "train_without"] = "drop",
) -> LateRewards:
    """Wait for the pending rewards of `groups`, then apply the rule of the module doc.

    `fetch` may return rewards for any of the pending trajectories it is given, on any
    call; a value that is not a finite number is an error (NonFiniteRewardError), and so
    is an exception `fetch` raises (`langfuse_fetcher` raises none for a Langfuse that is
    down, slow or answering errors: that is nothing arrived, see the module doc). The
    groups given are not changed: the result holds copies.
    """
    if timeout_s < 0 or poll_s <= 0:
        raise UsageError(f"timeout_s must be >= 0 and poll_s > 0, got {timeout_s}, {poll_s}")
    if on_timeout not in ("drop", "train_without"):
        raise UsageError(f'on_timeout is "drop" or "train_without", not {on_timeout!r}')
    copies = [g.model_copy(deep=True) for g in groups]
    pending = {t.id: t for g in copies for t in g.trajectories if is_pending(t)}
    result = LateRewards()
    start = time.monotonic()
    wait = _Wait(deadline=start + timeout_s)
    token = _WAIT.set(wait)
    try:
        while pending:
            got = fetch(list(pending.values()))
            rewards = await got if inspect.isawaitable(got) else got
            for tid, reward in dict(rewards).items():
                if (traj := pending.pop(tid, None)) is not None:
                    traj.reward = reward  # checked: NonFiniteRewardError for NaN
                    del traj.metadata[PENDING_KEY]
                    result.arrived += 1
            left = wait.deadline - time.monotonic()
            if not pending or left <= 0:
                break
            await asyncio.sleep(min(poll_s, left))
    finally:
        _WAIT.reset(token)
    result.waited_s = time.monotonic() - start
    result.missing = len(pending)
    result.fetch_errors = wait.errors
    for group in copies:
        if on_timeout == "train_without":
            for t in group.trajectories:
                t.metadata.pop(PENDING_KEY, None)
            kept = group
        else:
            kept = group.model_copy(
                update={"trajectories": [t for t in group.trajectories if t.id not in pending]}
            )
        if len(kept.trajectories) < 2:
            result.dropped_groups += 1
            continue
        result.groups.append(kept)
    return result


def langfuse_fetcher(
    *,
    name: str | None = None,
    source: Literal["ANNOTATION", "API", "EVAL"] | None = "ANNOTATION",
    queue_id: str | None = None,
    value_map: dict[str, float] | None = None,
    config: Any = None,
    completed_only: bool = True,
) -> Fetch:
    """A `fetch` reading Langfuse scores (by name / source / queue) for the pending
    trajectories' traces; needs the `langfuse` extra. Values become rewards as in
    `integrations.langfuse.import_scores`: numbers as they are, booleans 1 / 0, our
    categorical configs' labels by their values (review_decision: approve 1, reject 0),
    other labels through `value_map` (which also overrides those); a value none of these
    maps is not a reward yet. With `queue_id`, a review counts once its queue item is
    marked completed (`completed_only`, as `import_scores`). Fail-soft: a connection error, a timeout, a 4xx/5xx answer
    or a malformed page is logged (once per kind per wait) and returns no rewards. Each
    poll runs in a thread, its requests bounded by the time the wait has left (at least
    `MIN_POLL_S`) and by `config.timeout_s`."""
    import httpx
    import pydantic
    from langfuse.api.core.api_error import ApiError

    from art_langgraph.integrations.langfuse.config import LangfuseConfig
    from art_langgraph.integrations.langfuse.review import (
        fetch_scores,
        import_scores,
    )
    from art_langgraph.integrations.langfuse.traces import trace_id_for

    base: LangfuseConfig = config or LangfuseConfig()
    soft = (ApiError, httpx.HTTPError, TimeoutError, pydantic.ValidationError)

    async def fetch(pending: list[Trajectory]) -> dict[str, float]:
        wait = _WAIT.get()
        budget = base.timeout_s
        if wait is not None:
            budget = min(budget, max(wait.deadline - time.monotonic(), MIN_POLL_S))
        cfg = base.model_copy(update={"timeout_s": budget})

        # stand-ins carry only what import_scores matches on: the id and the trace id
        stand_ins = [
            Trajectory(
                id=t.id,
                metadata={
                    "langfuse_trace_id": str(t.metadata.get("langfuse_trace_id") or trace_id_for(t))
                },
            )
            for t in pending
        ]

        def poll() -> dict[str, float]:
            scores = fetch_scores(name=name, source=source, queue_id=queue_id, config=cfg)
            reviewed = import_scores(  # with queue_id: completed items only (completed_only)
                [TrajectoryGroup(stand_ins)],
                scores=scores,
                value_map=value_map,
                partial="drop",
                queue_id=queue_id,
                completed_only=completed_only,
                config=cfg,
            )
            return {t.id: t.reward for g in reviewed.groups for t in g.trajectories}

        try:
            return await asyncio.wait_for(
                asyncio.to_thread(poll),
                timeout=budget,  # the SDK retries a 5xx twice: bound the whole poll too
            )
        except soft as exc:
            _log_fetch_error(wait, exc, budget)
            return {}

    return fetch


def _log_fetch_error(wait: _Wait | None, exc: BaseException, budget: float) -> None:
    status = getattr(exc, "status_code", None)
    kind = f"HTTP {status}" if status is not None else type(exc).__name__
    if status is not None:
        detail = str(getattr(exc, "body", ""))
    elif isinstance(exc, TimeoutError):  # the SDK retries a 5xx twice: it may end here too
        detail = f"no answer within {budget:.1f} s"
    else:
        detail = str(exc)
    if wait is not None:
        wait.errors += 1
        if kind in wait.warned:
            return
        wait.warned.add(kind)
    logger.warning(
        "Langfuse scores could not be read (%s: %s); counted as no reward arrived yet, "
        "polling on until the wait's timeout",
        kind,
        detail[:200],
    )
