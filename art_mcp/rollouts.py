"""One episode of the agent on one scenario, captured and scored: what `train` and `check` run.

`Rollouts` holds what every episode of a run shares: the model, the server (one process,
or one per episode), the server's tools plus `complete_task`, the turn policy
(`force_tool_calls`) and the reward function. `agent(temperature)` builds a LangGraph
agent (`create_agent`) at one sampling temperature; `run(scenario, agent)` plays one
episode under `art.capture` (its sampling draws seeded when given a seed), reads its
final answer and scores it. A reward function
that raises is counted in `errors`: a training episode is then dropped (the exception
propagates to `gather_trajectory_groups`), a held-out one scored 0. An episode stopped
by anything but running out of turns (a model call the server refused, a server gone) is
scored as it ended and counted in `episode_errors`, so `check` and `train` can say so.

`refills` is dynamic sampling's order of extra scenarios for a step (`refill_groups`),
and `flat_groups` counts the groups it replaces: one reward for every rollout.

Left out: what is done with the episodes (harness.py trains on them, check.py reports on
them); the judge (scoring.py).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

from langgraph.errors import GraphRecursionError

import art_langgraph as art
from art_langgraph.errors import UsageError
from art_langgraph.training import is_zero_variance
from art_mcp.agent import SYSTEM, complete_task_tool, final_answer, force_tool_calls
from art_mcp.config import HarnessConfig
from art_mcp.scenarios import Scenario
from art_mcp.scoring import RewardErrors, RewardFn, score
from art_mcp.servers import Servers


def refills(
    train_set: Sequence[Scenario], step_items: Sequence[Scenario], seed: int, step: int
) -> Iterator[Scenario]:
    """The training scenarios a step may roll out in place of its flat groups: every one
    not in the step's own batch, in an order seeded by the run's seed and the step (the
    same in every process, so a resumed run draws what the first would have)."""
    taken = {s.id for s in step_items}
    rest = [s for s in train_set if s.id not in taken]
    random.Random(f"{seed}/refill/{step}").shuffle(rest)
    return iter(rest)


def flat_groups(groups: Sequence[art.TrajectoryGroup]) -> int:
    """Groups whose rollouts all got one reward: no GRPO signal (the trainer skips them)."""
    return sum(is_zero_variance([t.reward for t in g.trajectories]) for g in groups)


class Rollouts:
    """Episodes of one run's agent (see the module doc)."""

    def __init__(
        self, model: art.Model, servers: Servers, cfg: HarnessConfig, reward: RewardFn | None
    ) -> None:
        self.model = model
        self.servers = servers
        self.cfg = cfg
        self.reward = reward
        self.errors = RewardErrors()
        self.episode_errors = RewardErrors()
        """Episodes stopped by an exception other than running out of turns."""
        self.tools = [*servers.toolset.langchain_tools(), complete_task_tool()]
        self._turns = force_tool_calls(
            cfg.max_turns if cfg.final_answer_turn else None,
            required=cfg.tool_choice == "required",
            after_repeat=cfg.after_repeat,
        )

    def agent(self, temperature: float) -> Any:
        """The agent, sampling at `temperature` (0: greedy)."""
        from langchain.agents import create_agent

        return create_agent(
            self.model.chat_model(max_tokens=self.cfg.max_tokens, temperature=temperature),
            tools=self.tools,
            system_prompt=SYSTEM,
            middleware=[self._turns],
        )

    async def run(
        self, s: Scenario, agent: Any, *, held_out: bool = False, seed: int | None = None
    ) -> art.Trajectory:
        """One episode of `agent` on `s`, captured and scored (see the module doc); `seed`
        fixes its sampling draws (`art.capture(seed=)`: each model call's own), None leaves
        them to the engine."""
        async with self.servers.world():
            with art.capture(metadata={"scenario": s.id}, seed=seed) as traj:
                try:
                    await agent.ainvoke(
                        # A turn is two graph steps (the model, then its tools): this many
                        # steps allow `max_turns` model calls, no more.
                        {"messages": [("user", s.task)]},
                        {"recursion_limit": 2 * self.cfg.max_turns},
                    )
                except GraphRecursionError as exc:  # out of turns: scored as it ended
                    traj.log(f"rollout stopped: {exc!r}")
                except Exception as exc:  # a refused call, a server gone: scored, and counted
                    self.episode_errors.add(exc)
                    traj.log(f"rollout stopped: {exc!r}")
        traj.metadata["answer"] = final_answer(traj)
        try:
            traj.reward = await score(self.reward, traj, s)
        except Exception as exc:
            self.errors.add(exc)
            if not held_out:  # a training rollout without a reward is dropped, and counted
                raise UsageError(
                    f"the reward function failed on scenario {s.id!r}: {exc!r}"
                ) from exc
            traj.reward = 0.0  # held out: scored as a failure, so evaluation goes on
            traj.metadata["reward_error"] = repr(exc)
        return traj
