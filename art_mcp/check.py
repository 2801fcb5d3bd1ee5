"""`art-mcp check`: will this setup learn? One small step's rollouts, before any compute is spent.

ART's own advice is to validate a reward function on a handful of rollouts before
scaling; `check` does it with the arguments `train` takes. It runs the first RL step's
rollouts (`groups_per_step` scenarios of the train split, `group_size` each at the
training temperature, plus one greedy episode per scenario) of the model RL would start
from: the untrained one, or, when `train` would warm-start (demonstrations in the
scenarios or `--sft`, and `sft_epochs` not 0), the model after that same warm start
(`warm_start.warm_start`, its probe included), which it times. It times the rollouts,
trains that step on the throwaway model (in a temporary folder) to time training too,
and reports (`Preflight`):

- sampled and greedy success, the format rate (the first call names the right tool and
  runs), the reward's mean and spread;
- the share of groups whose rollouts all got one reward: GRPO learns nothing from them;
- the share of truncated rollouts (they used every one of `max_turns`: out of turns, or
  answering on the forced final-answer turn) and of repeated identical tool calls;
  truncation past `TRUNCATION_COMMON` adds "raise --max-turns" to the verdict;
- the reward function's errors (count and first traceback);
- the time of the warm start, of a step and of the whole run (the warm start, `steps`,
  and the evaluations) on this machine;
- a verdict: learnable as set up, or what to change (`verdict`).

`summarize` builds the same report from any step's groups: `train` prints it for its
first step.

Left out: the warm start's own checks beyond `train`'s (its probe and loss lines are
logged as `train` logs them); the judge's cost (a RULER run is timed with the rollouts it scores only in
`train`); scenarios generated for the check are not saved.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import art_langgraph as art
from art_langgraph.backend.checkpoints import CheckpointFolder
from art_langgraph.errors import UsageError
from art_langgraph.utils import iterate_dataset
from art_mcp.agent import demonstrations
from art_mcp.backends import backend_for, machine_line
from art_mcp.config import HarnessConfig
from art_mcp.evaluation import episode_calls, episode_format
from art_mcp.progress import say, terminal
from art_mcp.rollouts import Rollouts
from art_mcp.scenario_source import run_scenarios
from art_mcp.scenarios import Scenario, few_scenarios, load_scenarios, split_scenarios
from art_mcp.scoring import RewardFn, load_reward, penalize_repeats, task_reward
from art_mcp.servers import Servers, check_server
from art_mcp.warm_start import warm_start

FLAT_GROUPS_LIMIT = 0.5
"""Past this share of groups with one reward for all rollouts, a step trains on too little."""
TOO_HARD = 0.05
"""Sampled success below this: GRPO rarely sees a success to reinforce."""
TOO_EASY = 0.9
"""Sampled success above this, with most groups flat: little left to learn."""
TRUNCATION_COMMON = 0.25
"""Past this share of truncated rollouts, the verdict says to raise the turn budget."""


class Preflight(BaseModel):
    """What RL's first step's rollouts say about a setup (see the module doc)."""

    rollouts: int
    """Sampled rollouts scored (groups x group size, less the dropped ones)."""
    groups: int
    sampled_success: float
    """Share of sampled rollouts at or above `success_reward`."""
    greedy_success: float | None
    """Share of the scenarios whose greedy episode succeeded; None when none was run."""
    format_rate: float
    """Share of sampled rollouts whose first call named the right tool and ran."""
    reward_mean: float
    reward_sd: float
    flat_groups: float
    """Share of groups whose rollouts all got one reward (no signal for GRPO)."""
    truncated: float = 0.0
    """Share of sampled rollouts that used all `max_turns` model turns: they ran out of
    turns, or their answer was forced by the final-answer turn."""
    repeated_calls: float = 0.0
    """Share of the sampled rollouts' tool calls (complete_task aside) that repeat an
    earlier call of the same rollout, name and arguments alike."""
    reward_errors: int
    """Rollouts whose reward function raised (dropped from training)."""
    first_error: str = ""
    episode_errors: int = 0
    """Episodes (sampled and greedy) stopped by an error other than running out of turns:
    a model call the server refused, a server gone. Scored as they ended."""
    first_episode_error: str = ""
    warm_start_s: float | None = None
    """Wall time of the SFT warm start the check ran before the rollouts, as `train` would
    (seconds); None when there was none."""
    rollout_s: float | None = None
    """Wall time of the step's rollouts (seconds)."""
    train_s: float | None = None
    """Wall time of training on them (seconds); None when not measured."""
    run_s: float | None = None
    """Estimated wall time of the whole run: the warm start, `steps` steps and the held-out
    evaluations."""
    ok: bool
    """Learnable as set up."""
    verdict: str
    """One line: learnable, or what to change."""

    def lines(self) -> list[str]:
        """The report, as the lines `check` and `train` print."""
        greedy = "-" if self.greedy_success is None else f"{self.greedy_success:.2f}"
        out = [
            f"{self.rollouts} rollouts in {self.groups} groups: sampled success "
            f"{self.sampled_success:.2f}, greedy {greedy}, format {self.format_rate:.2f}, "
            f"reward {self.reward_mean:.2f} +- {self.reward_sd:.2f}; "
            f"{self.flat_groups:.0%} of groups had one reward for all rollouts; "
            f"{self.truncated:.0%} of rollouts truncated (out of turns or a forced answer), "
            f"{self.repeated_calls:.0%} of tool calls repeated",
        ]
        if self.reward_errors:
            out.append(
                f"the reward function raised in {self.reward_errors} episodes; first:\n"
                f"{self.first_error}"
            )
        if self.episode_errors:
            out.append(
                f"{self.episode_errors} episodes stopped with an error; first:\n"
                f"{self.first_episode_error}"
            )
        if self.rollout_s is not None:
            warm = (
                "" if self.warm_start_s is None else f"SFT warm start {self.warm_start_s:.0f} s, "
            )
            t = f"time: {warm}rollouts {self.rollout_s:.0f} s"
            if self.train_s is not None:
                t += f", training {self.train_s:.0f} s, a step ~{self.rollout_s + self.train_s:.0f} s"
            if self.run_s is not None:
                with_ = "its warm start and evaluations" if warm else "its evaluations"
                t += f"; the run ~{self.run_s / 60:.0f} min with {with_}"
            out.append(t)
        out.append(("learnable as set up: " if self.ok else "change the setup: ") + self.verdict)
        return out


def summarize(
    groups: list[art.TrajectoryGroup],
    scenarios: list[Scenario],
    cfg: HarnessConfig,
    *,
    greedy: list[art.Trajectory] | None = None,
    errors: tuple[int, str] = (0, ""),
    episode_errors: tuple[int, str] = (0, ""),
) -> Preflight:
    """The report of one step's groups (their trajectories carry `metadata["scenario"]`,
    `scenarios` the scenarios they ran); `greedy`: one greedy episode per scenario;
    `errors` and `episode_errors`: the reward function's and the episodes' (count, first)."""
    by_id = {s.id: s for s in scenarios}
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [float(t.reward) for t in trajs]
    won = [task_reward(t) >= cfg.success_reward for t in trajs]
    formats = [
        episode_format(t, by_id[t.metadata["scenario"]])
        for t in trajs
        if t.metadata.get("scenario") in by_id
    ]
    flat = [len({t.reward for t in g.trajectories}) <= 1 for g in groups if len(g.trajectories) > 1]
    n_err, first = errors
    p = Preflight(
        rollouts=len(trajs),
        groups=len(groups),
        sampled_success=_mean(won),
        greedy_success=(
            _mean([task_reward(t) >= cfg.success_reward for t in greedy]) if greedy else None
        ),
        format_rate=_mean(formats),
        reward_mean=_mean(rewards),
        reward_sd=statistics.pstdev(rewards) if rewards else 0.0,
        flat_groups=_mean(flat),
        truncated=_mean([len(t.calls) >= cfg.max_turns for t in trajs]),
        repeated_calls=_repeated_share(trajs, cfg.success_reward),
        reward_errors=n_err,
        first_error=first,
        episode_errors=episode_errors[0],
        first_episode_error=episode_errors[1],
        ok=True,
        verdict="",
    )
    p.ok, p.verdict = _verdict(p, cfg, rewards)
    return p


def _mean(xs: list[bool] | list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _repeated_share(trajs: list[art.Trajectory], success_reward: float) -> float:
    """Share of tool calls (complete_task aside) that repeat an earlier one of their rollout."""
    counts = [episode_calls(t, success_reward) for t in trajs]
    calls = sum(c.calls for c in counts)
    return sum(c.repeated for c in counts) / calls if calls else 0.0


def _verdict(p: Preflight, cfg: HarnessConfig, rewards: list[float]) -> tuple[bool, str]:
    ok, verdict = _base_verdict(p, cfg, rewards)
    if p.truncated > TRUNCATION_COMMON:
        verdict += (
            f"; {p.truncated:.0%} of rollouts used all {cfg.max_turns} turns (out of turns or "
            "a forced answer): raise --max-turns"
        )
    return ok, verdict


def _base_verdict(p: Preflight, cfg: HarnessConfig, rewards: list[float]) -> tuple[bool, str]:
    if p.reward_errors:
        return False, (
            f"the reward function raised in {p.reward_errors} episodes (train drops them): "
            "fix it and check again"
        )
    if p.episode_errors:
        return False, (
            f"{p.episode_errors} episodes stopped with an error before the agent finished "
            "(the first is above): fix it and check again"
        )
    if not rewards:
        return False, "no rollout finished: see the log above for why"
    if len(set(rewards)) == 1:
        return False, (
            f"every rollout got reward {rewards[0]:g}: the reward gives GRPO no signal; try "
            "the reward function on a rollout by hand (a constant, a wrong field, a "
            "success_reward the reward never reaches)"
        )
    if p.sampled_success < TOO_HARD and p.flat_groups > FLAT_GROUPS_LIMIT:
        return False, (
            f"too hard: sampled success {p.sampled_success:.2f} and {p.flat_groups:.0%} of "
            "groups without a spread; give easier scenarios, partial credit in the reward, "
            "more turns (--max-turns), an SFT warm start (--sft-epochs), or a larger model"
        )
    if p.sampled_success > TOO_EASY and p.flat_groups > FLAT_GROUPS_LIMIT:
        return False, (
            f"too easy: sampled success {p.sampled_success:.2f} before training; give harder "
            "scenarios or a stricter reward"
        )
    if p.flat_groups > FLAT_GROUPS_LIMIT:
        return False, (
            f"{p.flat_groups:.0%} of groups had one reward for all {cfg.group_size} rollouts: "
            "raise --group-size, or give the reward partial credit"
        )
    return True, (
        f"{1 - p.flat_groups:.0%} of groups carry a signal, sampled success {p.sampled_success:.2f}"
    )


async def _warm_start(
    model: art.TrainableModel,
    cfg: HarnessConfig,
    folder: Path,
    train_set: list[Scenario],
    sft: list[Any] | str | Path | None,
    rollouts: Rollouts,
    log: Callable[[str], None],
) -> float | None:
    """The warm start `train` would run before RL (`warm_start.warm_start`, its probe
    running greedy episodes as `train`'s does), on the check's throwaway model; its wall
    time, or None when `train` would run none (no demonstrations, or `sft_epochs` 0)."""
    demos = demonstrations(sft, train_set, rollouts.tools)
    if not cfg.warm_start_epochs(len(demos)):
        return None
    log(
        f"train warm-starts RL on {len(demos)} demonstrations first; so does the check "
        "(--sft-epochs 0 checks RL from the untrained model)"
    )
    greedy = rollouts.agent(0.0)

    async def probe(scenarios: list[Scenario]) -> list[float]:
        trajs = await asyncio.gather(*(rollouts.run(s, greedy, held_out=True) for s in scenarios))
        return [t.reward for t in trajs]

    tick = time.perf_counter()
    await warm_start(model, cfg, folder, 0, train_set, sft, rollouts.tools, probe, log)
    n_err, first = rollouts.episode_errors.take()
    if n_err:
        log(f"{n_err} warm-start probe episodes stopped with an error; first:\n{first}")
    rollouts.errors.take()  # a raising reward shows again in the step's rollouts
    return time.perf_counter() - tick


def run_estimate(
    cfg: HarnessConfig,
    step_s: float,
    episode_s: float,
    held_out: int,
    *,
    done: int = 0,
    warm_start_s: float = 0.0,
) -> float:
    """Seconds left for a run at RL step `done`: the steps to `cfg.steps` at `step_s` each,
    and the held-out evaluations still to come (before RL when `done` is 0, every
    `eval_every` steps, after the last) at `episode_s` an episode. At step 0 a warm start
    of `warm_start_s` (not 0) adds its time and, with `eval_untrained`, the untrained
    model's evaluation before it."""
    evals = sum(
        k == cfg.steps or bool(cfg.eval_every and k % cfg.eval_every == 0)
        for k in range(done + 1, cfg.steps + 1)
    ) + (done == 0)
    warm = warm_start_s if done == 0 else 0.0
    evals += bool(warm and cfg.eval_untrained)
    n_eval = min(cfg.eval_scenarios or held_out, held_out)
    return warm + (cfg.steps - done) * step_s + evals * n_eval * (1 + cfg.eval_samples) * episode_s


async def check(
    server: Any,
    config: HarnessConfig | None = None,
    *,
    scenarios: list[Scenario] | str | Path | None = None,
    reward: RewardFn | str | None = None,
    env: dict[str, str] | None = None,
    sft: list[Any] | str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Preflight:
    """Run RL's first step's rollouts of the model `train` would start RL from (after its
    warm start on `sft`, else the scenarios' demonstrations, when it would run one) and
    report (see the module doc). Nothing is written under `config.path`: the model, its
    steps and the generated scenarios live in a temporary folder, removed at the end."""
    cfg = config or HarnessConfig()
    log = log or say
    if cfg.backend is not None:
        raise UsageError("check runs on the embedded backend; leave --backend out")
    check_server(server, cfg)
    reward_fn = load_reward(reward) if isinstance(reward, str) else reward
    if reward_fn is None:
        raise UsageError("check needs the reward function (--reward module:function)")
    if isinstance(scenarios, str | Path):
        scenarios = load_scenarios(scenarios)
    from art_langgraph.presets import check_base_model

    check_base_model(cfg.base_model)
    log(f"machine: {machine_line(cfg)}")
    with tempfile.TemporaryDirectory(prefix="art-check-") as tmp:
        local = cfg.model_copy(update={"path": tmp})
        backend = backend_for(local, None, log)  # the engine train would build
        servers = Servers(server, local, env=env, stderr_log=Path(tmp) / "mcp-server.log")
        try:
            await servers.toolset.start()
            model = art.TrainableModel(
                name="check",
                project=cfg.project,
                base_model=cfg.base_model,
                training=art.ModelConfig(compute_dtype=cfg.compute_dtype),
            )
            await model.register(backend)
            folder = CheckpointFolder.of(tmp, cfg.project, "check").root
            scen = await run_scenarios(scenarios, local, servers.toolset, model, folder, log)
            train_set, val_set = split_scenarios(scen, cfg.val_fraction, cfg.seed)
            if warning := few_scenarios(len(train_set), len(val_set), cfg.groups_per_step):
                log(warning)
            batch = next(
                iter(
                    iterate_dataset(
                        train_set, groups_per_step=cfg.groups_per_step, num_epochs=1, seed=cfg.seed
                    )
                )
            )
            rollouts = Rollouts(model, servers, cfg, reward_fn)
            sampled, greedy_agent = rollouts.agent(cfg.temperature), rollouts.agent(0.0)
            warm_s = await _warm_start(model, local, folder, train_set, sft, rollouts, log)
            log(
                f"{len(batch.items)} scenarios x {cfg.group_size} rollouts at temperature "
                f"{cfg.temperature:g}, and one greedy episode each, "
                + ("untrained" if warm_s is None else "after the SFT warm start")
            )
            tick = time.perf_counter()
            groups_task = art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollouts.run(s, sampled) for _ in range(cfg.group_size))
                    for s in batch.items
                ),
                progress=terminal(),
                max_exceptions=math.inf,  # a raising reward is counted, not fatal
            )
            greedy_task = asyncio.gather(
                *(rollouts.run(s, greedy_agent, held_out=True) for s in batch.items)
            )
            groups, greedy = await asyncio.gather(groups_task, greedy_task)
            penalize_repeats(groups, cfg.repeat_penalty, cfg.success_reward)  # as train's steps
            rollout_s = time.perf_counter() - tick
            report = summarize(
                groups,
                batch.items,
                cfg,
                greedy=list(greedy),
                errors=rollouts.errors.take(),
                episode_errors=rollouts.episode_errors.take(),
            )
            report.rollout_s, report.warm_start_s = rollout_s, warm_s
            if any(len({t.reward for t in g.trajectories}) > 1 for g in groups):
                tick = time.perf_counter()
                await model.train(
                    groups,
                    cfg.rl_config(),
                )
                report.train_s = time.perf_counter() - tick
            episodes = sum(len(g.trajectories) for g in groups) + len(greedy)
            step_s = rollout_s + (report.train_s or 0.0)
            report.run_s = run_estimate(
                cfg, step_s, rollout_s / max(episodes, 1), len(val_set), warm_start_s=warm_s or 0.0
            )
        finally:
            await servers.close()
            await backend.close()
    for line in report.lines():
        log(line)
    return report
