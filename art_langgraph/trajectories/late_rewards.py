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

`integrations.langfuse.langfuse_fetcher(...)` is a `fetch` that reads Langfuse scores
(the `langfuse` extra); a fetch that talks to a service reads the wait's deadline and counts
its failed polls through `current_wait()`.

Left out: pushing rewards to a waiting trainer (polling is what Langfuse's API offers),
partial credit for groups whose rewards arrive at different steps, and fail-soft for a
`fetch` of your own (an exception it raises stops the wait).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from art_langgraph.errors import UsageError
from art_langgraph.trajectories.trajectory import Trajectory, TrajectoryGroup

PENDING_KEY = "reward_pending"
"""The trajectory metadata key that marks a reward as not known yet."""
DEFAULT_TIMEOUT_S = 900.0
"""15 minutes: Langfuse's score and trace read APIs can lag by about 10 minutes."""

Fetch = Callable[[list[Trajectory]], "Mapping[str, float] | Awaitable[Mapping[str, float]]"]
"""`fetch(pending) -> {trajectory id: reward}` for the rewards that arrived (sync or async)."""


@dataclass
class Wait:
    """The wait in progress, as a `fetch` sees it (`current_wait()`): a fetch that talks to
    a service bounds its requests by the deadline and counts its failed polls here."""

    deadline: float
    """`time.monotonic()` at which the wait stops polling."""
    warned: set[str] = field(default_factory=set)
    """Kinds of fetch errors already logged in this wait."""
    errors: int = 0
    """Polls whose fetch failed."""


_WAIT: contextvars.ContextVar[Wait | None] = contextvars.ContextVar("_WAIT", default=None)


def current_wait() -> Wait | None:
    """The `wait_for_rewards` in progress in this context; None outside one."""
    return _WAIT.get()


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
    """Polls whose fetch failed softly (a service down, slow, or answering an error: see
    `integrations.langfuse.langfuse_fetcher`) and counted as nothing arrived."""


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
    is an exception `fetch` raises (`integrations.langfuse.langfuse_fetcher` raises none for
    a Langfuse that is down, slow or answering errors: that is nothing arrived). The
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
    wait = Wait(deadline=start + timeout_s)
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
