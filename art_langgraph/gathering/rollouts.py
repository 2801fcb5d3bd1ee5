"""A GRPO group of one task: `n` fresh runs of a graph on one input, each captured and scored.

`rollouts(graph, input, n, reward=fn)` invokes `graph.ainvoke(input, config)` `n` times
concurrently, each inside its own `capture()`, calls `fn(trajectory, output)` (sync or
async) on each finished run, and returns the runs as one `TrajectoryGroup`, ready for
`model.train([...])` or `gather_trajectory_groups`. It is the loop every LangGraph
training script writes by hand (`with art.capture() as traj: ...; traj.reward = ...`),
run concurrently so the server batches the `n` runs' requests. Any LangChain runnable
with `ainvoke` works: a compiled graph, `create_agent`'s agent, a chain.

A run that raises, or whose reward function raises, becomes an entry of
`group.exceptions` and the other runs go on, as in `gather_trajectory_groups`;
cancellation is not a run's failure and propagates. `run_group` is the part shared with
`branch.py`, whose runs continue one saved checkpoint instead of starting fresh.

Left out: several tasks at once (build one group per task and pass them all to
`gather_trajectory_groups`, or to `model.train`), retries, and a checkpointer's thread
per run (pass `configure` to give each run its own `thread_id`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig

from art_langgraph.errors import UsageError
from art_langgraph.tracing.callback import TrainNodes
from art_langgraph.tracing.capture import capture, derive_seed
from art_langgraph.trajectories.trajectory import ExceptionInfo, Trajectory, TrajectoryGroup

Reward = Callable[[Trajectory, Any], "float | Awaitable[float]"]
"""`reward(trajectory, output)`: the score of one finished run, from its trajectory and
what the graph returned; sync or async."""

Configure = Callable[[int, RunnableConfig], RunnableConfig]
"""`configure(i, config) -> config`: run i's config (a copy, which it may change)."""


async def rollouts(
    graph: Any,
    input: Any,
    n: int,
    *,
    reward: Reward | None = None,
    config: RunnableConfig | Mapping[str, Any] | None = None,
    configure: Configure | None = None,
    metadata: dict[str, Any] | None = None,
    max_concurrency: int | None = None,
    train_nodes: TrainNodes | None = None,
    seed: int | None = None,
) -> TrajectoryGroup:
    """Run `graph` on `input` `n` times, concurrently, each in its own `capture()`; return
    the runs as one group.

    Args:
        graph: anything with `ainvoke(input, config)`: a compiled LangGraph graph, an agent
            from `create_agent`, a LangChain runnable; its chat model is the trainable
            model's (`model.chat_model()`), or nothing trains.
        input: what every run is invoked with (the same task for the whole group).
        n: runs in the group, at least 1 (GRPO compares them with each other).
        reward: `reward(trajectory, output)`, sync or async; its value becomes
            `trajectory.reward`. None leaves rewards at 0 (score the group afterwards).
        config: the run config every run gets a copy of (callbacks, recursion_limit, ...).
        configure: `configure(i, config) -> config` adjusts run i's copy, e.g. a
            `thread_id` of its own for a graph with a checkpointer.
        metadata: JSON data kept as the group's metadata.
        max_concurrency: at most this many runs at once; None runs all n at once.
        train_nodes: which nodes' calls train, as `capture(train_nodes=...)`; None: all.
        seed: seeds the group's sampling: run i runs under `capture(seed=derive_seed(seed,
            i))`, so each run draws its own tokens and the same seed draws them again (as
            far as the server's logits repeat: a batch of other shapes may round them
            differently). None: unseeded requests, the server's shared generator.

    Returns:
        One `TrajectoryGroup`: a trajectory per run that finished (in run order,
        `metadata["run"]` its index), an `ExceptionInfo` in `exceptions` per run whose graph
        or `reward` raised.

    Raises:
        UsageError: `graph` has no `ainvoke`, or `n` / `max_concurrency` is out of range.
    """
    if not hasattr(graph, "ainvoke"):
        raise UsageError(
            f"rollouts() takes a graph or runnable with ainvoke(), got {type(graph).__name__}"
        )
    check_counts("rollouts", n, max_concurrency)
    base: RunnableConfig = dict(config or {})  # type: ignore[assignment]

    def run_config(i: int) -> RunnableConfig:
        cfg: RunnableConfig = {
            **base,
            "configurable": dict(base.get("configurable") or {}),
            "metadata": dict(base.get("metadata") or {}),
        }
        return configure(i, cfg) if configure is not None else cfg

    return await run_group(
        [(i, run_config(i)) for i in range(n)],
        lambda cfg: graph.ainvoke(input, cfg),
        reward=reward,
        max_concurrency=max_concurrency,
        train_nodes=train_nodes,
        index_key="run",
        part_of_thread=False,
        metadata=dict(metadata or {}),
        seed=seed,
    )


def check_counts(what: str, n: int, max_concurrency: int | None) -> None:
    """A UsageError for a group of fewer than 1 run or a concurrency limit below 1."""
    if n < 1:
        raise UsageError(f"{what}() needs n >= 1 runs, got n={n}")
    if max_concurrency is not None and max_concurrency < 1:
        raise UsageError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")


async def run_group(
    configs: list[tuple[int, RunnableConfig]],
    invoke: Callable[[RunnableConfig], Awaitable[Any]],
    *,
    reward: Reward | None,
    max_concurrency: int | None,
    train_nodes: TrainNodes | None,
    index_key: str,
    part_of_thread: bool,
    metadata: dict[str, Any],
    seed: int | None = None,
) -> TrajectoryGroup:
    """Run `invoke(config)` for each `(index, config)`, concurrently (at most
    `max_concurrency` at once), each inside a `capture()` whose trajectory's
    `metadata[index_key]` is the index; score each with `reward`; gather them into one
    group, failures as `exceptions`. `seed`: run i's capture is seeded `derive_seed(seed, i)`."""
    limit = asyncio.Semaphore(max_concurrency or max(len(configs), 1))

    async def one(i: int, cfg: RunnableConfig) -> Trajectory:
        async with limit:
            with capture(
                metadata={index_key: i},
                train_nodes=train_nodes,
                part_of_thread=part_of_thread,
                seed=None if seed is None else derive_seed(seed, i),
            ) as traj:
                output = await invoke(cfg)
            if reward is not None:
                value = reward(traj, output)
                traj.reward = await value if inspect.isawaitable(value) else value
        return traj

    results = await asyncio.gather(*(one(i, c) for i, c in configs), return_exceptions=True)
    trajectories: list[Trajectory] = []
    exceptions: list[ExceptionInfo] = []
    for result in results:
        if isinstance(result, Trajectory):
            trajectories.append(result)
        elif isinstance(result, Exception):
            exceptions.append(ExceptionInfo.from_exception(result))
        else:  # CancelledError, KeyboardInterrupt: not a run's failure
            raise result
    return TrajectoryGroup(trajectories=trajectories, exceptions=exceptions, metadata=metadata)
