"""`art_mcp.train`: from an MCP server to a trained agent, with no training code of yours.

It connects to the server (`MCPToolset`, servers.py), loads or generates scenarios and
splits them train/val (scenario_source.py), registers a trainable model on an embedded
`LocalBackend` (resuming from its checkpoints after a restart), optionally warm-starts it
with SFT on demonstrations, and then runs GRPO steps: a LangGraph agent (`create_agent`)
over the server's tools plus a `complete_task(answer)` tool that ends the run (agent.py),
`max_turns` at most, each rollout captured; groups scored by your reward function and/or
RULER, less `repeat_penalty` (scoring.py; `shuffle_rewards`: the control arm);
`model.train`. The held-out scenarios are evaluated before RL and after the last step,
greedy and sampled (`art_mcp.evaluation`), scored as training scores (the reward
function, else the judge). What is done is saved as it happens, so the same command
resumes an interrupted run (the model's name and recipe: recipe.py) and the report
(`art_mcp.report`: JSON, markdown with changed episodes, a reward curve PNG in the
model's folder) is rebuilt from what was saved. A reward function that raises is counted
and shown per step; a step that trained on nothing says so (progress.py). Before it
starts, a run prints the machine and the dtypes `auto` chose; after the untrained
evaluation, an estimate of its time, refined after its first step, whose rollouts also
get `art-mcp check`'s summary and verdict (check.py). Episodes are played and scored by
`Rollouts` (rollouts.py). This module is the loop; each part it drives lives in the
module named above, the knobs in config.py (`HarnessConfig`).

Left out: multi-server toolsets and tool allow-lists (wrap your server instead).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import art_langgraph as art
from art_langgraph.backend.base import Backend
from art_langgraph.backend.checkpoints import CheckpointFolder
from art_langgraph.errors import UsageError
from art_langgraph.utils import iterate_dataset
from art_mcp.agent import demonstrations
from art_mcp.backends import backend_for, machine_line
from art_mcp.check import run_estimate, summarize
from art_mcp.config import HarnessConfig, default_learning_rate
from art_mcp.evaluation import (
    Evaluation,
    check_langfuse_dataset,
    episode_calls,
    episode_format,
    eval_draws,
    eval_sample,
    evaluation_label,
    log_to_langfuse,
    transcript,
)
from art_mcp.progress import (
    EngineTally,
    TrainingProgress,
    peak_rss,
    say,
    terminal,
    trained_note,
)
from art_mcp.recipe import check_recipe, default_name, recipe_of, server_label
from art_mcp.report import (
    Report,
    append_journal,
    build_report,
    eval_line,
    evaluated_weights,
    flat_run,
    grpo_steps,
    journal_evaluations,
    read_journal,
    write_report,
)
from art_mcp.rollouts import Rollouts, flat_groups, refills
from art_mcp.scenario_source import run_scenarios
from art_mcp.scenarios import Scenario, few_scenarios, load_scenarios, split_scenarios
from art_mcp.scoring import (
    CountedJudge,
    RewardFn,
    group_judge,
    judge_held_out,
    judge_params,
    load_reward,
    penalize_repeats,
    shuffle_rewards,
)
from art_mcp.servers import Servers, check_server
from art_mcp.warm_start import replay, warm_start

_STEP_KEYS = ("reward", "zero_variance_groups", "groups", "nothing_trainable", "trajectories")
"""The train metrics a journal step line keeps (report.py rebuilds rows from them)."""


async def train(
    server: Any,
    config: HarnessConfig | None = None,
    *,
    scenarios: list[Scenario] | str | Path | None = None,
    reward: RewardFn | str | None = None,
    sft: list[Any] | str | Path | None = None,
    backend: Backend | None = None,
    env: dict[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> Report:
    """Train an agent over `server` (a command, a URL or a server object); see the module
    doc. `env`: variables added to a stdio server's environment (API keys, settings)."""
    cfg = config or HarnessConfig()
    log = log or say
    reward_fn, scenarios = _check_inputs(server, cfg, scenarios, reward, backend)
    t0 = time.perf_counter()
    own_backend = backend is None
    backend = backend_for(cfg, backend, log)
    if own_backend and cfg.backend is None:
        log(f"machine: {machine_line(cfg)}")
    if cfg.learning_rate is None:
        lr, why = default_learning_rate(cfg.base_model)
        log(f"learning rate {lr:g}: {why} (--learning-rate sets one)")
    server_log = Path(cfg.path) / cfg.project / "logs" / "mcp-server.log"
    server_log.parent.mkdir(parents=True, exist_ok=True)
    server_log.write_bytes(b"")  # this run's: a failure quotes nothing of an earlier run
    servers = Servers(server, cfg, env=env, stderr_log=server_log)
    run = _Run(cfg, log, servers, reward_fn, t0)
    try:
        await run.start(server, scenarios, reward, backend)
        await run.before_rl(sft)
        await run.rl_steps()
        return await run.finish()
    except (asyncio.CancelledError, KeyboardInterrupt):
        # Ctrl-C: one line, not the tracebacks of every task it cancelled.
        log(
            f"interrupted during {run.phase}; what finished is saved (checkpoints, evaluations): "
            "run the same command to resume"
        )
        raise
    finally:
        await servers.close()
        if own_backend:
            await backend.close()


def _check_inputs(
    server: Any,
    cfg: HarnessConfig,
    scenarios: list[Scenario] | str | Path | None,
    reward: RewardFn | str | None,
    backend: Backend | None,
) -> tuple[RewardFn | None, list[Scenario] | None]:
    """The reward function and the scenarios, loaded; a UsageError for what cannot run,
    before any server or engine starts."""
    check_server(server, cfg)
    reward_fn = load_reward(reward) if isinstance(reward, str) else reward
    if reward_fn is None and cfg.judge is None:
        raise UsageError(
            "give a reward function (--reward module:function), a judge (--judge), or both"
        )
    if isinstance(scenarios, str | Path):
        scenarios = load_scenarios(scenarios)  # a bad file fails before anything starts
    elif isinstance(scenarios, list) and not scenarios:
        raise UsageError("scenarios is an empty list")
    if backend is None and cfg.backend is None:
        from art_langgraph.presets import check_base_model

        check_base_model(cfg.base_model)
    return reward_fn, scenarios


class _Run:
    """One `train` call's state and its phases, in order: `start` (the server, the model,
    the scenarios, the agents), `before_rl` (the untrained evaluation, the estimate, the SFT
    warm start, the evaluation before RL), `rl_steps`, `finish` (a cut-off last evaluation,
    judge calibration, the report). Each phase first reads what the model's folder says is
    done, so a resumed run goes on from where the last one stopped."""

    def __init__(
        self,
        cfg: HarnessConfig,
        log: Callable[[str], None],
        servers: Servers,
        reward_fn: RewardFn | None,
        t0: float,
    ) -> None:
        self.cfg, self.log, self.servers, self.reward_fn, self.t0 = cfg, log, servers, reward_fn, t0
        self.phase = "start-up"
        """What the run is doing, for the line an interrupt prints."""
        self.pace: list[float] = []
        """Seconds per held-out episode of each evaluation, for the run's estimate."""
        self.demos: list[Any] = []
        """The demonstrations RL steps replay (`sft_replay`); none when it is off."""

    async def start(
        self,
        server: Any,
        scenarios: list[Scenario] | None,
        reward: RewardFn | str | None,
        backend: Backend,
    ) -> None:
        """Start the server, register the model, check the folder's recipe and the review
        queue, load or generate the scenarios and split them, build the agents."""
        cfg, log, toolset = self.cfg, self.log, self.servers.toolset
        await toolset.start()
        if toolset.stderr_log is not None:
            log(f"the server's stderr goes to {toolset.stderr_log}")
        self.label = server_label(server)
        recipe = recipe_of(self.label, cfg, scenarios, reward)
        self.name = cfg.name or default_name(self.label, cfg.base_model, recipe)
        if cfg.name is None:
            log(
                f"model name {self.name} (from the server, base model, scenarios, reward and judge; --name sets one)"
            )
        self.model = art.TrainableModel(
            name=self.name,
            project=cfg.project,
            base_model=cfg.base_model,
            training=art.ModelConfig(
                compute_dtype=cfg.compute_dtype,
                promote_on_evaluation=cfg.promote_on_evaluation,
                seed=cfg.seed,
            ),
        )
        await self.model.register(backend)
        self.engine_tally = EngineTally(backend)
        # The harness's own files (scenarios, report) go beside the checkpoints when the
        # backend is embedded, under --path here when it is remote.
        where = getattr(backend, "path", cfg.path)  # a remote backend has none here
        self.folder = CheckpointFolder.of(where, cfg.project, self.name).root
        check_recipe(self.folder, recipe, cfg.allow_recipe_change)
        if cfg.review_queue:  # a clashing queue or missing keys stop here, before any rollout
            from art_langgraph.integrations.langfuse import annotation

            annotation.check_queue(cfg.review_queue)
        await check_langfuse_dataset(self.name, cfg)  # a clashing held-out dataset stops here too
        scen = await run_scenarios(scenarios, cfg, toolset, self.model, self.folder, log)
        self.train_set, val_set = split_scenarios(scen, cfg.val_fraction, cfg.seed)
        self.held_out = len(val_set)
        self.val_set = eval_sample(val_set, cfg.eval_scenarios, cfg.seed)
        evaluated = (
            "" if len(self.val_set) == self.held_out else f" ({len(self.val_set)} evaluated)"
        )
        log(
            f"{len(toolset.tools)} tools from {self.label}; {len(self.train_set)} train / "
            f"{self.held_out} val scenarios{evaluated}"
        )
        if warning := few_scenarios(len(self.train_set), self.held_out, cfg.groups_per_step):
            log(warning)
        self.rollouts = Rollouts(self.model, self.servers, cfg, self.reward_fn)
        self.train_agent = self.rollouts.agent(cfg.temperature)
        self.eval_agents = {True: self.rollouts.agent(0.0), False: self.rollouts.agent(1.0)}
        self.ruler_params = judge_params(cfg, self.model)
        self.judge = group_judge(self.ruler_params)
        self.scored_by = (
            "reward function"
            if self.ruler_params is None
            else "RULER judge"
            if self.reward_fn is None
            else "RULER judge, as in training (the reward function's score kept per episode)"
        )

    async def before_rl(self, sft: list[Any] | str | Path | None) -> None:
        """The untrained model's evaluation and the run's estimate, the SFT warm start when
        there are demonstrations, and the evaluation before RL after it: each unless the
        folder says it was done."""
        cfg, log, model = self.cfg, self.log, self.model
        journal = read_journal(self.folder)
        evaluations = journal_evaluations(journal)
        grpo_done = len(grpo_steps(self.folder, journal))
        step = await model.get_step()
        untrained_due = cfg.eval_untrained and not any(e.step == 0 for e in evaluations)
        if step == grpo_done == 0 and untrained_due:
            self.phase = "the untrained model's held-out evaluation"
            # The untrained model first, so the report can tell what training did.
            untrained = await self.evaluate(0, 0)
            evaluations.append(untrained)
            log(f"untrained: held-out {eval_line(untrained)}")
            self.save_report()
            if cfg.steps:
                # Rollouts at the evaluation's pace, training counted as long again
                # (this is refined after the first step, which measures both).
                step_s = 2 * cfg.groups_per_step * cfg.group_size * self.pace[-1]
                run_s = run_estimate(cfg, step_s, self.pace[-1], self.held_out, done=0)
                log(
                    f"estimate: ~{step_s:.0f} s a step, ~{run_s / 60:.0f} min for "
                    f"{cfg.steps} steps and the evaluations (refined after step 1)"
                )
        if cfg.sft_replay:  # the demonstrations RL steps replay (`warm_start.replay`)
            self.demos = demonstrations(sft, self.train_set, self.rollouts.tools)
        if grpo_done == 0:
            self.phase = "the SFT warm start"
            await warm_start(
                model, cfg, self.folder, step, self.train_set, sft, self.rollouts.tools,
                self.probe if self.reward_fn is not None else None, log,
            )  # fmt: skip
        start_step = await model.get_step()
        if grpo_done == 0 and not any(e.rl_step == 0 and e.step == start_step for e in evaluations):
            self.phase = "the held-out evaluation before RL"
            before = await self.evaluate(start_step, 0)
            what = (
                "untrained, before RL" if start_step == 0 else "after the SFT warm start, before RL"
            )
            log(f"{what}: held-out {eval_line(before)}")
        self.save_report()

    async def probe(self, scenarios: list[Scenario]) -> list[float]:
        """The warm start's probe: each scenario's greedy reward, as an evaluation's."""
        trajs = await asyncio.gather(
            *(self.rollout(s, self.eval_agents[True], held_out=True) for s in scenarios)
        )
        self.report_errors("warm-start probe")
        return [t.reward for t in trajs]

    async def rl_steps(self) -> None:
        """The GRPO steps still to do, each over a batch of training scenarios in the
        seeded order, going on from the steps the folder holds."""
        cfg = self.cfg
        grpo_done = len(grpo_steps(self.folder, read_journal(self.folder)))
        epochs = 1 + (cfg.steps * cfg.groups_per_step) // max(len(self.train_set), 1)
        batches = iterate_dataset(
            self.train_set,
            groups_per_step=cfg.groups_per_step,
            num_epochs=epochs,
            seed=cfg.seed,
            initial_step=grpo_done,
        )
        if grpo_done < cfg.steps and self.ended_flat():
            self.log(
                f"RL ended after step {grpo_done} of {cfg.steps}: its last {cfg.stop_when_flat} "
                "steps trained on nothing (--stop-when-flat 0 goes on)"
            )
        for batch in batches:
            if batch.step >= cfg.steps or self.ended_flat():
                break
            await self.rl_step(batch.step, batch.items, first_here=batch.step == grpo_done)

    def ended_flat(self) -> bool:
        """Whether RL has ended early: the last `stop_when_flat` GRPO steps, in a row,
        trained on nothing (read from the folder, so a restart keeps the verdict)."""
        k = self.cfg.stop_when_flat
        return bool(k) and flat_run(grpo_steps(self.folder, read_journal(self.folder))) >= k

    async def rl_step(self, index: int, items: list[Scenario], *, first_here: bool) -> None:
        """RL step `index + 1`: its rollouts (and the pre-flight summary on step 1), the
        control arm's shuffle, the GRPO step, the estimate after the first step this
        process ran, the review queue, the journal, and the evaluation when one is due
        (after the last step, every `eval_every`, and when RL ends early: `ended_flat`)."""
        cfg, log, model = self.cfg, self.log, self.model
        done = index + 1
        self.phase = f"RL step {done}"
        tick = time.perf_counter()
        self.engine_tally.start()
        judged = CountedJudge(self.judge)
        first = latest = groups = await self.gather(items, judged, f"RL step {done} rollouts")
        spare, extra = refills(self.train_set, items, cfg.seed, index), list[Scenario]()
        while (flat := flat_groups(latest)) and len(extra) < cfg.refill_groups:
            more = list(itertools.islice(spare, min(flat, cfg.refill_groups - len(extra))))
            if not more:
                break
            extra += more
            latest = await self.gather(more, judged, f"RL step {done} refills")
            groups = [*groups, *latest]
        n = sum(len(g.trajectories) for g in groups)
        line = f"RL step {done}: {n} of {(len(items) + len(extra)) * cfg.group_size} rollouts"
        if extra:
            line += f" ({len(extra)} groups drawn in place of flat ones)"
        if self.judge is not None:
            line += f", {judged.calls} groups judged ({judged.dropped} dropped)"
        rollout_s = time.perf_counter() - tick
        log(f"{line} in {rollout_s:.0f} s{self.engine_tally.note()}{peak_rss()}; training")
        errors = self.report_errors(f"RL step {done}")
        if index == 0:  # the pre-flight summary (art-mcp check), from this step
            pre = summarize(first, items, cfg, errors=errors[0], episode_errors=errors[1])
            pre.rollout_s = rollout_s
            for text in pre.lines():
                log(f"RL step 1 pre-flight: {text}")
        if cfg.shuffle_rewards:
            shuffle_rewards(groups, random.Random(f"{cfg.seed}/{index}"))
        tick = time.perf_counter()
        with TrainingProgress(f"RL step {done} training") as progress:
            result = await model.train(
                groups,
                cfg.rl_config(),
                progress=progress,
            )
        replayed = await replay(model, cfg, self.demos, index)
        train_s = time.perf_counter() - tick
        note = " and one replay step on demonstrations" if replayed else ""
        log(
            f"RL step {done}: trained {progress.micro_batches} micro-batches "
            f"({progress.tokens} tokens){note} in {train_s:.0f} s{peak_rss()}"
        )
        if first_here:  # the first step this process ran
            step_s = rollout_s + train_s
            pace = self.pace[-1] if self.pace else 0.0
            left = run_estimate(cfg, step_s, pace, self.held_out, done=done)
            log(
                f"estimate: {step_s:.0f} s a step; ~{left / 60:.0f} min to go for "
                f"{cfg.steps - done} more steps and their evaluations"
            )
        if cfg.review_queue:  # fail-soft: what is not sent is recorded for re-sending
            from art_langgraph.integrations.langfuse import annotation

            await asyncio.to_thread(
                annotation.send_to_review,
                groups,
                queue=cfg.review_queue,
                fraction=cfg.review_fraction,
                seed=cfg.seed,
                folder=self.folder,
                split="train",
                step=result.step,
            )
        m = result.metrics
        append_journal(
            self.folder, "step", {"step": result.step, **{k: m[k] for k in _STEP_KEYS if k in m}}
        )
        train_reward = m.get("reward", float("nan"))
        ends = done < cfg.steps and self.ended_flat()
        if done == cfg.steps or ends or (cfg.eval_every and done % cfg.eval_every == 0):
            held = await self.evaluate_if_changed((replayed or result).step, done)
        else:
            held = "-"
        log(
            f"RL step {done}: train reward {train_reward:.2f}{trained_note(m, self.ruler_params)}, "
            f"held-out {held}"
        )
        if ends:
            log(
                f"RL ends after step {done} of {cfg.steps}: {cfg.stop_when_flat} steps in a row "
                "trained on nothing (--stop-when-flat; 0 runs every step)"
            )
        self.save_report()

    async def gather(
        self, items: list[Scenario], judged: CountedJudge, desc: str
    ) -> list[art.TrajectoryGroup]:
        """`group_size` training rollouts per scenario, judged if a judge scores, penalized."""
        groups = (
            art.TrajectoryGroup(self.rollout(s) for _ in range(self.cfg.group_size)) for s in items
        )
        judge = judged if self.judge is not None else None
        done = await art.gather_trajectory_groups(
            groups, pbar_desc=desc, progress=terminal(), max_exceptions=0.5, after_each=judge
        )
        return penalize_repeats(done, self.cfg.repeat_penalty, self.cfg.success_reward)

    async def finish(self) -> Report:
        """The last step's evaluation if an interrupt cut it off, the judge's calibration
        against the reviews, and the report."""
        cfg, log = self.cfg, self.log
        grpo_done = len(grpo_steps(self.folder, read_journal(self.folder)))
        step = await self.model.get_step()
        journal = read_journal(self.folder)
        evaluations = journal_evaluations(journal)
        ended = grpo_done >= cfg.steps or self.ended_flat()
        fresh = evaluated_weights(evaluations, grpo_steps(self.folder, journal))
        if grpo_done and ended and not any(e.step == step for e in evaluations) and fresh is None:
            # The last step's evaluation was cut off by an interrupt: run it now.
            self.phase = f"the held-out evaluation after RL step {grpo_done}"
            ev = await self.evaluate(step, grpo_done)
            log(f"RL step {grpo_done}: held-out {eval_line(ev)}")
        if cfg.review_queue and self.ruler_params is not None:
            try:  # the judge against the reviews so far (review_calibration.json), and as
                # scores of the last evaluation's dataset run
                from art_langgraph.integrations.langfuse import review
                from art_langgraph.integrations.langfuse.datasets import last_run_id

                await asyncio.to_thread(
                    review.calibrate,
                    self.folder,
                    queue=cfg.review_queue,
                    dataset_run_id=last_run_id(self.folder),
                )
            except Exception as exc:
                log(f"judge calibration against {cfg.review_queue!r} not computed: {exc}")
        report = self.save_report()
        log(f"report: {self.folder / 'report.md'}")
        return report

    async def rollout(
        self, s: Scenario, agent: Any = None, *, held_out: bool = False
    ) -> art.Trajectory:
        """One episode of `s` with `agent` (the training agent when None)."""
        return await self.rollouts.run(s, agent or self.train_agent, held_out=held_out)

    def report_errors(self, where: str) -> tuple[tuple[int, str], tuple[int, str]]:
        """Log the reward function's errors and the episodes stopped by one since the last
        call; returns each as (count, first)."""
        count, first = self.rollouts.errors.take()
        if count:
            what = "dropped" if where.startswith("RL") else "scored 0"
            self.log(f"{where}: the reward function raised in {count} episodes ({what}); first:")
            self.log(first)
        stopped = self.rollouts.episode_errors.take()
        if stopped[0]:
            self.log(
                f"{where}: {stopped[0]} episodes stopped with an error (scored as they "
                "ended); first:"
            )
            self.log(stopped[1])
        return (count, first), stopped

    async def evaluate_if_changed(self, step: int, rl_step: int) -> str:
        """`evaluate`, unless no GRPO step since the last evaluation trained on anything and
        none replayed (`report.evaluated_weights`): that one stands for them. The held-out line."""
        journal = read_journal(self.folder)
        same = evaluated_weights(journal_evaluations(journal), grpo_steps(self.folder, journal))
        if same is None or self.demos:
            return eval_line(await self.evaluate(step, rl_step))
        return (
            f"not evaluated again: the adapter is step {same.step}'s, evaluated then "
            f"({eval_line(same)})"
        )

    async def evaluate(self, step: int, rl_step: int) -> Evaluation:
        """The held-out evaluation of the model's `step` (RL step `rl_step`): one greedy
        episode and `eval_samples` sampled ones per evaluated scenario, judged when a judge
        scores training; kept in the journal, logged, and promoted on when asked."""
        cfg, log = self.cfg, self.log
        label = evaluation_label(step, rl_step)
        tick = time.perf_counter()
        self.engine_tally.start()
        jobs = [(s, True) for s in self.val_set]
        jobs += [(s, False) for s in self.val_set for _ in range(cfg.eval_samples)]
        trajs = await asyncio.gather(
            *(
                self.rollouts.run(s, self.eval_agents[g], held_out=True, seed=None if g else d)
                for (s, g), d in zip(jobs, eval_draws(cfg.seed, jobs), strict=True)
            )
        )
        took = time.perf_counter() - tick
        self.pace.append(took / max(len(trajs), 1))
        log(f"{label}: {len(trajs)} episodes in {took:.0f} s{self.engine_tally.note()}{peak_rss()}")
        self.report_errors(label)
        if self.ruler_params is not None:
            by_scenario: dict[str, list[art.Trajectory]] = {}
            for (s, _), t in zip(jobs, trajs, strict=True):
                by_scenario.setdefault(s.id, []).append(t)
            failed = await judge_held_out(list(by_scenario.values()), self.ruler_params)
            if failed:
                log(
                    f"{label}: the judge failed on {failed} of "
                    f"{len(by_scenario)} scenarios (their episodes keep the reward function's "
                    "score, or 0)"
                )
        ev = _evaluation(step, rl_step, cfg, jobs, trajs)
        if trajs:
            split = "untrained" if step == 0 else "val"
            await self.model.log([art.TrajectoryGroup(trajs)], split=split)
            await log_to_langfuse(self.name, cfg, step, rl_step, self.folder, jobs, trajs, log)
        append_journal(self.folder, "evaluation", json.loads(ev.model_dump_json()))
        if cfg.promote_on_evaluation and math.isfinite(ev.greedy_reward):
            decision = await self.model.record_evaluation(step, ev.greedy_reward)
            log(
                f"promotion: step {step} {'' if decision.promoted else 'not '}promoted: {decision.reason}"
            )
        return ev

    def save_report(self) -> Report:
        """The report rebuilt from the folder, written beside the checkpoints."""
        report = build_report(
            model=self.name,
            server=self.label,
            steps=self.cfg.steps,
            stop_when_flat=self.cfg.stop_when_flat,
            folder=self.folder,
            scored_by=self.scored_by,
            seconds=time.perf_counter() - self.t0,
            scenarios=self.val_set,
        )
        write_report(report, self.folder)
        return report


def _evaluation(
    step: int,
    rl_step: int,
    cfg: HarnessConfig,
    jobs: list[tuple[Scenario, bool]],
    trajs: list[art.Trajectory],
) -> Evaluation:
    """An evaluation's record from its episodes: greedy rewards, formats and transcripts
    per scenario, sampled rewards per scenario, the sampled episodes' format rate, every
    episode's calls."""
    ev = Evaluation(step=step, rl_step=rl_step, success_reward=cfg.success_reward)
    formats = []
    for (s, greedy), t in zip(jobs, trajs, strict=True):
        ev.calls.setdefault(s.id, []).append(episode_calls(t, cfg.success_reward))
        if greedy:
            ev.greedy[s.id] = t.reward
            ev.greedy_format[s.id] = episode_format(t, s)
            ev.transcripts[s.id] = transcript(t)
        else:
            ev.sampled.setdefault(s.id, []).append(t.reward)
            formats.append(episode_format(t, s))
    ev.sampled_format = sum(formats) / len(formats) if formats else None
    return ev
