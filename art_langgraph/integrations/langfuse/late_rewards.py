"""Rewards from Langfuse for a wait (`late_rewards.wait_for_rewards`): `langfuse_fetcher`.

It reads Langfuse scores (through `review.fetch_scores`) for the pending trajectories'
traces and turns them into rewards as `import_scores` does (review_decision approve 1 /
reject 0, bool 1 / 0, `review_score` over `review_decision`, corrections skipped). It is
fail-soft: a Langfuse that is down, slow, or answering 4xx/5xx (or a malformed page) costs
a logged warning (one per kind of error per wait) and counts as "nothing arrived yet", so
the wait goes on to its timeout; `LateRewards.fetch_errors` counts those polls. Each poll's
requests are bounded by the time the wait has left (at least `MIN_POLL_S`), so a slow server
cannot hold the wait past its timeout by more than that.

Left out: misuse is not soft (missing Langfuse keys stop the wait).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

import httpx
import pydantic

from art_langgraph.integrations.langfuse.config import LangfuseConfig
from art_langgraph.integrations.langfuse.review import fetch_scores, import_scores
from art_langgraph.integrations.langfuse.traces import trace_id_for
from art_langgraph.trajectories.late_rewards import Fetch, Wait, current_wait
from art_langgraph.trajectories.trajectory import Trajectory, TrajectoryGroup

logger = logging.getLogger(__name__)

MIN_POLL_S = 1.0
"""The least time one poll gets, even at or past the wait's deadline."""


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
    from langfuse.api.core.api_error import ApiError

    base: LangfuseConfig = config or LangfuseConfig()
    soft = (ApiError, httpx.HTTPError, TimeoutError, pydantic.ValidationError)

    async def fetch(pending: list[Trajectory]) -> dict[str, float]:
        wait = current_wait()
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


def _log_fetch_error(wait: Wait | None, exc: BaseException, budget: float) -> None:
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
