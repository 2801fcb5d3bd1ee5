"""Branching: a group of rollouts that all continue one thread from one saved checkpoint.

`branch(graph, config, n)` runs `n` continuations of the thread in
`config["configurable"]["thread_id"]` from the checkpoint in
`config["configurable"]["checkpoint_id"]` (the thread's latest when none is given,
pinned before any branch starts), each inside its own `capture()`, concurrently, and
returns them as one `TrajectoryGroup`. It is LangGraph's own time travel:
`graph.ainvoke(input, config)` with a checkpoint id forks the thread there, so every
branch starts from the same state and the checkpointer keeps each branch as a fork of
its own in the same thread. `input=None` continues from the checkpoint; a
`Command(resume=...)` answers the interrupt the checkpoint waits at; any other input
is applied on top of the checkpoint's state, as LangGraph applies new input.

Why: GRPO compares rollouts of the same situation. Rolling out a long agent run from
the start to compare what happens at step 5 spends most of the time (and most of the
trained tokens) on steps 1-4; branching from the checkpoint before step 5 makes only
the part after it differ. The branches share the history token for token (assistant
turns go back to the server as the ids they were sampled as), so the trainer's prefix
tree (`training.tensorize`) computes the shared history once for the whole group.

Each trajectory holds the calls of its branch only (the history before the checkpoint
is prompt, not trained), `messages` the whole conversation the graph returned, and
`metadata["branch"]` its index; the group's metadata records `thread_id` and
`checkpoint_id`. A branch that raises becomes an entry of `group.exceptions`.

Left out: copying the checkpoint to other threads (every fork stays in its thread, as
LangGraph's time travel keeps them) and choosing the checkpoint (pass the id:
`LLMCall.checkpoint_id` of the call to branch before, or one from
`graph.aget_state_history(config)`). Sampling differs between branches as long as
the chat model is not seeded (no `seed=` in `model.chat_model(...)`); `seed=` gives each
branch seeds of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from langchain_core.runnables import RunnableConfig

from art_langgraph.errors import UsageError
from art_langgraph.gathering.rollouts import Configure, Reward, check_counts, run_group
from art_langgraph.tracing.callback import TrainNodes
from art_langgraph.trajectories.trajectory import TrajectoryGroup


async def branch(
    graph: Any,
    config: RunnableConfig | Mapping[str, Any],
    n: int,
    *,
    input: Any = None,
    metadata: dict[str, Any] | None = None,
    configure: Configure | None = None,
    reward: Reward | None = None,
    max_concurrency: int | None = None,
    train_nodes: TrainNodes | None = None,
    seed: int | None = None,
) -> TrajectoryGroup:
    """Run `n` continuations of one thread from one checkpoint; return them as a group.

    Args:
        graph: a compiled LangGraph graph with a checkpointer (`builder.compile(checkpointer=...)`).
        config: the run config; `configurable.thread_id` names the thread and
            `configurable.checkpoint_id` the checkpoint to branch from (None or absent: the
            thread's latest checkpoint, resolved once so every branch starts from it). Other
            keys (recursion_limit, callbacks, ...) go to every branch.
        n: number of branches, at least 1.
        input: what each branch is invoked with: None continues from the checkpoint,
            `Command(resume=...)` resumes the interrupt it waits at, anything else is new
            input applied on top of its state.
        metadata: JSON data merged into the group's metadata (next to `thread_id` and
            `checkpoint_id`).
        configure: `configure(i, config) -> config` adjusts branch i's config (a copy), e.g.
            its tags or callbacks; it must keep the thread and checkpoint.
        reward: `reward(trajectory, output)`, sync or async, scores a finished branch from
            its trajectory and the graph's output; its value becomes `trajectory.reward`.
            None leaves rewards at 0 (score the group afterwards).
        max_concurrency: at most this many branches run at once; None runs all n at once.
        train_nodes: which nodes' calls train, as `capture(train_nodes=...)`; None: all.
        seed: seeds the branches' sampling, as `rollouts(seed=)` seeds its runs (branch i
            under `capture(seed=derive_seed(seed, i))`); None: unseeded.

    Returns:
        One `TrajectoryGroup`: a trajectory per branch that finished (in branch order,
        `metadata["branch"]` its index), an `ExceptionInfo` in `exceptions` per branch
        whose graph run or `reward` raised (the other branches go on).

    Raises:
        UsageError: the graph has no checkpointer, the config names no thread, the
            checkpoint does not exist in the thread, or an argument is out of range.
    """
    check_counts("branch", n, max_concurrency)
    thread_id, checkpoint_id, base = await _resolve(graph, config)
    configs = [(i, _branch_config(base, i, configure, thread_id, checkpoint_id)) for i in range(n)]
    return await run_group(
        configs,
        lambda cfg: graph.ainvoke(input, cfg),
        reward=reward,
        max_concurrency=max_concurrency,
        train_nodes=train_nodes,
        index_key="branch",
        part_of_thread=True,
        metadata={**(metadata or {}), "thread_id": thread_id, "checkpoint_id": checkpoint_id},
        seed=seed,
    )


async def _resolve(
    graph: Any, config: RunnableConfig | Mapping[str, Any]
) -> tuple[str, str, RunnableConfig]:
    """The thread, the checkpoint id (checked to exist, or the latest) and the config
    addressing it; a UsageError for what cannot be branched."""
    if not hasattr(graph, "aget_state") or not hasattr(graph, "ainvoke"):
        raise UsageError(
            f"branch() takes a compiled LangGraph graph (builder.compile(checkpointer=...)), "
            f"got {type(graph).__name__}"
        )
    if not getattr(graph, "checkpointer", None):
        raise UsageError(
            f"graph {getattr(graph, 'name', '?')!r} was compiled without a checkpointer, so it "
            "has no saved states to branch from: compile it with one, e.g. "
            "builder.compile(checkpointer=InMemorySaver()) or an AsyncSqliteSaver"
        )
    configurable = dict(config.get("configurable") or {})
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        raise UsageError(
            'branch() needs config["configurable"]["thread_id"]: the thread whose checkpoint '
            "the branches continue"
        )
    wanted = configurable.get("checkpoint_id")
    snapshot = await graph.aget_state({**config, "configurable": configurable})
    checkpoint_id = (snapshot.config.get("configurable") or {}).get("checkpoint_id")
    if snapshot.metadata is None or checkpoint_id is None:
        existing = [
            (s.config.get("configurable") or {}).get("checkpoint_id")
            async for s in graph.aget_state_history(
                {"configurable": {"thread_id": thread_id}}, limit=5
            )
        ]
        what = f"no checkpoint {wanted!r}" if wanted else "no checkpoints"
        raise UsageError(
            f"thread {thread_id!r} has {what}; "
            + (
                f"its latest checkpoint ids: {', '.join(map(str, existing))}"
                if existing
                else "the thread has no checkpoints at all (run the graph on it first)"
            )
        )
    configurable["checkpoint_id"] = checkpoint_id
    base = cast(RunnableConfig, {**config, "configurable": configurable})
    return str(thread_id), str(checkpoint_id), base


def _branch_config(
    base: RunnableConfig,
    i: int,
    configure: Configure | None,
    thread_id: str,
    checkpoint_id: str,
) -> RunnableConfig:
    """Branch i's config: a copy of `base` (callbacks and other live objects shared, not
    copied), passed through `configure`, still addressing the thread and checkpoint."""
    cfg: RunnableConfig = {
        **base,
        "configurable": dict(base.get("configurable") or {}),
        "metadata": dict(base.get("metadata") or {}),
    }
    if configure is None:
        return cfg
    cfg = configure(i, cfg)
    got = cfg.get("configurable") or {}
    if str(got.get("thread_id")) != thread_id or got.get("checkpoint_id") != checkpoint_id:
        raise UsageError(
            f"configure() must keep the thread and checkpoint of branch {i}: it returned "
            f"thread_id={got.get('thread_id')!r}, checkpoint_id={got.get('checkpoint_id')!r}, "
            f"expected {thread_id!r}, {checkpoint_id!r}"
        )
    return cfg
