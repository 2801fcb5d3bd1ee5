"""How `art_mcp.train` scores rollouts: your reward function, the RULER judge, the control arm.

`load_reward("module:function")` imports a reward function (`reward(trajectory, scenario)
-> float`, sync or async); `score` calls it and refuses a non-finite reward;
`RewardErrors` counts the exceptions of one phase. With a judge, RULER scores each
training group (`group_judge`, as `after_each`, counted by `CountedJudge`) and each held-out
scenario's episodes (`judge_held_out`), the reward function's score kept as
`independent_reward`. `shuffle_rewards` is the control arm: a step's rewards permuted
across its rollouts. `penalize_repeats` takes `repeat_penalty` off a solved training
rollout's reward per repeated tool call, keeping the score as `task_reward`.

Left out: RULER itself (art_langgraph/rewards); what a reward means (the user's).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import math
import os
import random
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import art_langgraph as art
from art_langgraph.errors import UsageError
from art_mcp.agent import call_key
from art_mcp.config import HarnessConfig
from art_mcp.scenarios import Scenario

RewardFn = Callable[[art.Trajectory, Scenario], float | Awaitable[float]]


def load_reward(spec: str) -> RewardFn:
    """`module:function` -> the function (reward(trajectory, scenario) -> float, sync or async)."""
    module, _, fn = spec.partition(":")
    if not module or not fn:
        raise UsageError(f"--reward takes module:function, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        # `python -m` puts the working directory on the path, console scripts do not: a
        # reward module beside the user's server should import either way.
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(
            f"cannot import the reward module {module!r} ({exc}); run from the folder that "
            "holds it, or put it on PYTHONPATH"
        ) from None
    obj = getattr(mod, fn, None)
    if not callable(obj):
        raise UsageError(f"{spec!r} is not a function: {module!r} has no callable {fn!r}")
    return obj  # type: ignore[no-any-return]


async def score(reward: RewardFn | None, traj: art.Trajectory, s: Scenario) -> float:
    """The reward function's score of a rollout (0.0 without one, when the judge scores);
    a reward that is not a finite number is the caller's error."""
    if reward is None:
        return 0.0
    value = reward(traj, s)
    if inspect.isawaitable(value):
        value = await value
    out = float(value)
    if not math.isfinite(out):
        raise UsageError(f"the reward function returned {out} (a reward must be a finite number)")
    return out


class RewardErrors:
    """Exceptions in one phase (the reward function's, or the episodes'): counted, the
    first traceback kept."""

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def add(self, exc: BaseException) -> None:
        if not self.count:
            self.first = "".join(traceback.format_exception(exc)).rstrip()
        self.count += 1

    def take(self) -> tuple[int, str]:
        out = (self.count, self.first)
        self.count, self.first = 0, ""
        return out


class CountedJudge:
    """The judge as `after_each`, counting its calls and the groups it dropped."""

    def __init__(self, judge: Any) -> None:
        self.judge = judge
        self.calls = self.dropped = 0

    async def __call__(self, group: art.TrajectoryGroup) -> Any:
        self.calls += 1
        out = await self.judge(group)
        self.dropped += out is None
        return out


def litellm_route(model: art.Model) -> tuple[str, str | None, str | None]:
    """A model this run serves, as litellm reaches it: its name, base URL and key."""
    return f"openai/{model.name}", model.inference_base_url, model.inference_api_key


def judge_params(cfg: HarnessConfig, model: art.Model) -> dict[str, Any] | None:
    """`ruler`'s judge, base_url, api_key and rubric for this run; None without a judge."""
    if cfg.judge is None:
        return None
    from art_langgraph.rewards import DEFAULT_RUBRIC

    judge, base_url, api_key = cfg.judge, None, None
    if judge == "local":
        judge, base_url, api_key = litellm_route(model)
    return {
        "judge": judge,
        "base_url": base_url,
        "api_key": api_key,
        "rubric": cfg.rubric or DEFAULT_RUBRIC,
    }


def group_judge(params: dict[str, Any] | None) -> Any:
    """The training groups' `after_each`: RULER over each group (None without a judge)."""
    if params is None:
        return None
    from art_langgraph.rewards import ruler_score_group

    return functools.partial(ruler_score_group, **params, swallow_exceptions=True)


async def judge_held_out(groups: list[list[art.Trajectory]], params: dict[str, Any]) -> int:
    """Score each scenario's held-out episodes with RULER, as training scores a group (the
    reward function's score kept as `independent_reward`); returns how many groups failed."""
    from art_langgraph.rewards import ruler

    async def one(trajs: list[art.Trajectory]) -> bool:
        try:
            scores = await ruler([t.messages for t in trajs], **params)
        except Exception as exc:  # a judge that fails is counted, not fatal
            log_ = trajs[0].log if trajs else None
            if log_ is not None:
                log_(f"RULER failed: {exc!r}")
            return False
        for t, sc in zip(trajs, scores, strict=True):
            t.metrics["independent_reward"] = t.reward
            t.metrics["ruler_score"] = sc.score
            t.reward = sc.score
        return True

    ok = await asyncio.gather(*(one(g) for g in groups))
    return sum(not x for x in ok)


def shuffle_rewards(groups: list[art.TrajectoryGroup], rng: random.Random) -> None:
    """The control arm: the step's rewards, permuted across all of its rollouts."""
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajs]
    rng.shuffle(rewards)
    for t, r in zip(trajs, rewards, strict=True):
        t.reward = r


def repeated_calls(traj: art.Trajectory) -> int:
    """Tool calls of `traj` (complete_task aside) that repeat an earlier one, name and
    arguments alike."""
    seen: set[str] = set()
    repeated = 0
    for ev in traj.tool_events:
        if ev.name == "complete_task":
            continue
        key = call_key(ev.name, ev.args)
        repeated += key in seen
        seen.add(key)
    return repeated


def task_reward(traj: art.Trajectory) -> float:
    """The reward function's (or judge's) score of `traj`, before `penalize_repeats`."""
    return float(traj.metadata.get("task_reward", traj.reward))


def penalize_repeats(
    groups: list[art.TrajectoryGroup], penalty: float, success_reward: float
) -> list[art.TrajectoryGroup]:
    """Take `penalty` off the reward of each trajectory that solved its task (reward at or
    above `success_reward`) per repeated tool call (`HarnessConfig.repeat_penalty`), once,
    keeping its score as `metadata["task_reward"]`; `groups`, changed in place. Failed
    ones keep theirs: GRPO scales a group's rewards by their spread, so a penalty among
    failures alone would teach the agent to give up before a second try."""
    if not penalty:
        return groups
    for g in groups:
        for t in g.trajectories:
            if "task_reward" not in t.metadata:
                t.metadata["task_reward"] = t.reward
                if t.reward >= success_reward:
                    t.reward = t.reward - penalty * repeated_calls(t)
    return groups
