"""`art_mcp.train`: from an MCP server to a trained agent, with no training code of yours.

It connects to the server (`MCPToolset`), loads or generates scenarios and splits them
train/val, registers a trainable model on an embedded `LocalBackend` (resuming from its
checkpoints after a restart), optionally warm-starts it with SFT on demonstrations, and
then runs GRPO steps: a LangGraph agent (`create_agent`) over the server's tools plus a
`complete_task(answer)` tool that ends the run, `max_turns` at most, each rollout
captured; groups scored by your reward function and/or RULER (`shuffle_rewards`: the
control arm); `model.train`. The held-out scenarios are evaluated before RL and after
the last step, greedy and sampled (`art_mcp.evaluation`). It writes a report (JSON,
markdown with changed episodes, and a reward curve PNG) into the model's folder.

Left out: multi-server toolsets and tool allow-lists (wrap your server instead).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib
import inspect
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

import art_langgraph as art
from art_langgraph.backend.base import Backend
from art_langgraph.errors import UsageError
from art_langgraph.utils import atomic_write, iterate_dataset
from art_mcp.evaluation import (
    Evaluation,
    changed_examples,
    episode_format,
    paired_rise,
    transcript,
)
from art_mcp.scenarios import (
    Scenario,
    generate_scenarios,
    load_scenarios,
    save_scenarios,
    split_scenarios,
)
from art_mcp.toolset import MCPToolset

__all__ = ["HarnessConfig", "Report", "default_name", "eval_sample", "load_reward", "train"]

RewardFn = Callable[[art.Trajectory, Scenario], float | Awaitable[float]]

SYSTEM = (
    "You are an agent that solves the user's task with the tools you have. Call tools as needed, "
    "then call complete_task with the final answer."
)


class HarnessConfig(BaseModel):
    """Every knob of `art_mcp.train` (and the `art-mcp train` flags)."""

    base_model: str = Field(
        "tiny",
        description=(
            "A preset ('tiny': random, for tests; 'smollm2-135m': SmolLM2-135M-Instruct), a HF "
            "id, a local folder or a .gguf file."
        ),
    )
    chat_template: str | None = Field(
        None,
        description=(
            "A Jinja chat template file replacing the model's own; None: the model's (tools in "
            "the generic format where it ignores them)."
        ),
    )
    name: str | None = Field(
        None,
        description=(
            "Model name; default: 'agent-' + a hash of the server command and base model, the "
            "same in every process, so running the same command again resumes."
        ),
    )
    project: str = Field("mcp", description="Project folder under --path.")
    path: str = Field(".art", description="Where models live on disk.")
    steps: int = Field(
        10, ge=0, description="GRPO steps to reach (a resumed run continues to this step count)."
    )
    group_size: int = Field(4, ge=2, description="Rollouts per scenario in a group.")
    groups_per_step: int = Field(8, ge=1, description="Scenarios (groups) per step.")
    max_turns: int = Field(4, ge=1, description="Most model turns in one rollout.")
    max_tokens: int = Field(96, ge=1, description="Most tokens per model turn.")
    temperature: float = Field(0.8, ge=0, description="Sampling temperature of the rollouts.")
    tool_choice: Literal["auto", "required"] = Field(
        "auto",
        description=(
            "'required': every model turn is one tool call, constrained to the tools' JSON "
            "schemas (the run ends at complete_task); helps small models. 'auto': the model may "
            "also answer in text."
        ),
    )
    eval_samples: int = Field(
        4,
        ge=0,
        description=(
            "Held-out evaluation: besides one greedy episode per scenario, this many sampled "
            "at temperature 1 (success is then the mean over scenarios of the solved share)."
        ),
    )
    eval_scenarios: int | None = Field(
        None,
        ge=1,
        description=(
            "Evaluate on this many held-out scenarios, a fixed sample drawn with --seed (the "
            "same one before and after training, and after a restart); None: all of them. "
            "An evaluation runs (1 + eval_samples) episodes per scenario."
        ),
    )
    success_reward: float = Field(
        1.0, description="The reward at or above which an episode counts as solved (reports)."
    )
    shuffle_rewards: bool = Field(
        False,
        description=(
            "Control arm: shuffle the rewards across all of a step's rollouts before training, "
            "so updates keep their size and shape but lose the signal. Whatever such a run "
            "gains is not learning from the reward; subtract it."
        ),
    )
    learning_rate: float = Field(
        5e-4, gt=0, description="GRPO learning rate (the tiny preset: 5e-4; 7B: ~1e-5)."
    )
    eval_every: int = Field(
        0,
        ge=0,
        description=(
            "Also evaluate on the held-out scenarios every this many steps; 0: only before RL "
            "and after the last step."
        ),
    )
    val_fraction: float = Field(
        0.25, ge=0, lt=1, description="Share of scenarios held out for evaluation."
    )
    n_scenarios: int = Field(24, ge=2, description="Scenarios to generate when none are given.")
    generator: str | None = Field(
        None,
        description=(
            "litellm model for scenario generation; 'local' = the model being trained; None: "
            "'local' when no scenarios are given."
        ),
    )
    judge: str | None = Field(
        None,
        description="litellm model for RULER; 'local' = the model being trained; None = no judge.",
    )
    rubric: str | None = Field(None, description="RULER rubric; None = the default rubric.")
    sft_epochs: int = Field(
        3,
        ge=0,
        description="Epochs of the SFT warm start (when demonstrations exist); 0: no warm start.",
    )
    sft_learning_rate: float = Field(
        3e-3, gt=0, description="Learning rate of the SFT warm start (the tiny preset: 3e-3)."
    )
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "The trainer's matmul dtype (ModelConfig.compute_dtype): 'bfloat16' autocast halves "
            "a real model's step time and activation memory on CPUs with AMX, at a larger "
            "sampler/trainer logprob mismatch."
        ),
    )
    engine_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "The inference engine's weights and KV-cache dtype (TorchEngineConfig.dtype); auto: "
            "bfloat16 on CUDA, float32 on the CPU. 'bfloat16' halves the engine's memory and "
            "speeds it up on CPUs with AMX; pair it with compute_dtype='bfloat16' so sampler "
            "and trainer round alike."
        ),
    )
    micro_batch_tokens: int = Field(
        16384,
        ge=1,
        description=(
            "Tokens per forward/backward pass of the trainer (TrainConfig.micro_batch_tokens); "
            "on SmolLM2-135M activations take ~1.8 MB per token in fp32 without activation "
            "checkpointing, a small fraction of that with it (the default)."
        ),
    )
    seed: int = Field(0, description="Seed for the split and the step order.")
    engine: Literal["auto", "torch", "vllm"] = Field(
        "auto",
        description=(
            "The embedded backend's inference engine: torch (ours), vllm (a managed vLLM "
            "server; scripts/setup-vllm.sh installs it), auto (vLLM with a GPU, else torch)."
        ),
    )
    backend: str | None = Field(
        None,
        description=(
            "URL of an `art-langgraph backend` server to train on (RemoteBackend; its key from "
            "$ART_API_KEY); default: an embedded LocalBackend. chat_template and engine_dtype "
            "are then the server's."
        ),
    )


class Report(BaseModel):
    """What a harness run did; also written as report.json/.md/.png in the model folder."""

    model: str
    server: str
    steps: int
    rows: list[dict[str, float]] = Field(default_factory=list)
    """One row per RL step: step (the checkpoint), rl_step (0 = before RL), val_reward (NaN
    where not evaluated), train_reward."""
    val_reward_untrained: float | None = None
    """Held-out reward of the base model, before the SFT warm start (None: no warm start)."""
    val_reward_before: float | None = None
    """Held-out reward before the first RL step (after any warm start): RL step 0."""
    val_reward_after: float | None = None
    """Held-out reward at the last evaluation."""
    val_reward_best: float | None = None
    """Best held-out reward after RL step 0."""
    evaluations: list[Evaluation] = Field(default_factory=list)
    """Every held-out evaluation, the untrained model's first."""
    paired: dict[str, dict[str, float]] = Field(default_factory=dict)
    """"greedy"/"sampled" -> the paired per-scenario rise in success from the untrained
    model to the last evaluation: {"rise", "se", "n"}."""
    examples: list[dict[str, Any]] = Field(default_factory=list)
    """A few held-out scenarios whose greedy episode changed, before and after."""
    seconds: float = 0.0
    folder: str = ""


def default_name(server_label: str, base_model: str) -> str:
    """The model name when none is given: the same server and base model give the same
    name in every process, so a second run resumes the first (Python's `hash()` would not)."""
    digest = hashlib.sha256(f"{server_label}\n{base_model}".encode()).hexdigest()
    return f"agent-{digest[:10]}"


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


def _complete_task_tool() -> Any:
    from langchain_core.tools import tool

    @tool(return_direct=True)
    def complete_task(answer: str) -> str:
        """Finish the task and give the final answer."""
        return answer

    return complete_task


def _force_tool_calls() -> Any:
    """Agent middleware: every model turn is exactly one tool call (the server constrains it)."""
    from langchain.agents.middleware import wrap_model_call

    @wrap_model_call  # type: ignore[arg-type]
    async def force(request: Any, handler: Any) -> Any:
        settings = {**request.model_settings, "parallel_tool_calls": False}
        return await handler(request.override(tool_choice="required", model_settings=settings))

    return force


def eval_sample(val_set: list[Scenario], n: int | None, seed: int) -> list[Scenario]:
    """The held-out scenarios an evaluation runs: all, or a fixed sample of `n` drawn with
    `seed` (in their original order), so every evaluation of a run pairs the same ones."""
    if n is None or n >= len(val_set):
        return val_set
    keep = set(random.Random(f"{seed}/eval").sample(range(len(val_set)), n))
    return [s for i, s in enumerate(val_set) if i in keep]


def final_answer(traj: art.Trajectory) -> str:
    """The answer given to complete_task, else the last assistant text."""
    for ev in reversed(traj.tool_events):
        if ev.name == "complete_task" and isinstance(ev.args, dict):
            return str(ev.args.get("answer", ""))
    for m in reversed(traj.messages):
        if m.get("role") == "assistant" and m.get("content"):
            return str(m["content"])
    return ""


async def _score(reward: RewardFn | None, traj: art.Trajectory, s: Scenario) -> float:
    if reward is None:
        return 0.0
    value = reward(traj, s)
    if inspect.isawaitable(value):
        value = await value
    return float(value)


async def train(
    server: Any,
    config: HarnessConfig | None = None,
    *,
    scenarios: list[Scenario] | str | Path | None = None,
    reward: RewardFn | str | None = None,
    sft: list[Any] | str | Path | None = None,
    backend: Backend | None = None,
    env: dict[str, str] | None = None,
    log: Callable[[str], None] = print,
) -> Report:
    """Train an agent over `server` (a command, a URL or a server object); see the module
    doc. `env`: variables added to a stdio server's environment (API keys, settings)."""
    cfg = config or HarnessConfig()
    reward_fn = load_reward(reward) if isinstance(reward, str) else reward
    if reward_fn is None and cfg.judge is None:
        raise UsageError(
            "give a reward function (--reward module:function), a judge (--judge), or both"
        )
    if isinstance(scenarios, str | Path):
        scenarios = load_scenarios(scenarios)  # a bad file fails before anything starts
    elif isinstance(scenarios, list) and not scenarios:
        raise UsageError("scenarios is an empty list")
    t0 = time.perf_counter()
    own_backend = backend is None
    if backend is None and cfg.backend is not None:
        backend = art.RemoteBackend(cfg.backend, api_key=os.environ.get("ART_API_KEY"))
    if backend is None and cfg.engine == "vllm":
        from art_langgraph.engine.vllm_engine import VLLMEngineConfig

        vllm_config = VLLMEngineConfig(chat_template=cfg.chat_template, dtype=cfg.engine_dtype)
        backend = art.LocalBackend(path=cfg.path, engine="vllm", engine_config=vllm_config)
    if backend is None and (cfg.chat_template is not None or cfg.engine_dtype != "auto"):
        from art_langgraph.engine import TorchEngineConfig

        engine_config = TorchEngineConfig(
            chat_template=cfg.chat_template,
            dtype=None if cfg.engine_dtype == "auto" else cfg.engine_dtype,
        )
        backend = art.LocalBackend(path=cfg.path, engine="torch", engine_config=engine_config)
    elif backend is not None and (cfg.chat_template is not None or cfg.engine_dtype != "auto"):
        log(
            "chat_template and engine_dtype apply to the backend train() builds; yours keeps its own"
        )
    backend = backend or art.LocalBackend(path=cfg.path, engine=cfg.engine)
    server_log = Path(cfg.path) / cfg.project / "logs" / "mcp-server.log"
    toolset = MCPToolset(server, env=env, stderr_log=server_log)
    try:
        await toolset.start()
        if toolset.stderr_log is not None:
            log(f"the server's stderr goes to {toolset.stderr_log}")
        name = cfg.name or default_name(toolset.label, cfg.base_model)
        if cfg.name is None:
            log(f"model name {name} (from the server and base model; --name sets one)")
        model = art.TrainableModel(
            name=name,
            project=cfg.project,
            base_model=cfg.base_model,
            training=art.ModelConfig(compute_dtype=cfg.compute_dtype),
        )
        await model.register(backend)
        # The harness's own files (scenarios, report) go beside the checkpoints when the
        # backend is embedded, under --path here when it is remote.
        folder = Path(getattr(backend, "path", cfg.path)) / cfg.project / "models" / name
        scen = await _scenarios(scenarios, cfg, toolset, model, folder, log)
        train_set, val_set = split_scenarios(scen, cfg.val_fraction, cfg.seed)
        held_out = len(val_set)
        val_set = eval_sample(val_set, cfg.eval_scenarios, cfg.seed)
        evaluated = "" if len(val_set) == held_out else f" ({len(val_set)} evaluated)"
        log(
            f"{len(toolset.tools)} tools from {toolset.label}; {len(train_set)} train / "
            f"{held_out} val scenarios{evaluated}"
        )

        tools = [*toolset.langchain_tools(), _complete_task_tool()]
        from langchain.agents import create_agent

        def make_agent(temperature: float) -> Any:
            return create_agent(
                model.chat_model(max_tokens=cfg.max_tokens, temperature=temperature),
                tools=tools,
                system_prompt=SYSTEM,
                middleware=[_force_tool_calls()] if cfg.tool_choice == "required" else [],
            )

        train_agent = make_agent(cfg.temperature)
        greedy_agent = make_agent(0.0)
        sample_agent = make_agent(1.0)

        async def rollout(s: Scenario, agent: Any = train_agent) -> art.Trajectory:
            with art.capture(metadata={"scenario": s.id}) as traj:
                try:
                    await agent.ainvoke(
                        # A turn is two graph steps (the model, then its tools): this
                        # many steps allow `max_turns` model calls, no more.
                        {"messages": [("user", s.task)]},
                        {"recursion_limit": 2 * cfg.max_turns},
                    )
                except Exception as exc:  # out of turns, or a broken graph: scored, not fatal
                    traj.log(f"rollout stopped: {exc!r}")
            traj.metadata["answer"] = final_answer(traj)
            traj.reward = await _score(reward_fn, traj, s)
            return traj

        judge = _judge(cfg, model)

        async def evaluate(step: int, rl_step: int, split: str = "val") -> Evaluation:
            ev = Evaluation(step=step, rl_step=rl_step, success_reward=cfg.success_reward)
            jobs = [(s, True) for s in val_set]
            jobs += [(s, False) for s in val_set for _ in range(cfg.eval_samples)]
            trajs = await asyncio.gather(
                *(rollout(s, greedy_agent if greedy else sample_agent) for s, greedy in jobs)
            )
            formats = []
            for (s, greedy), t in zip(jobs, trajs, strict=True):
                if greedy:
                    ev.greedy[s.id] = t.reward
                    ev.greedy_format[s.id] = episode_format(t, s)
                    ev.transcripts[s.id] = transcript(t)
                else:
                    ev.sampled.setdefault(s.id, []).append(t.reward)
                    formats.append(episode_format(t, s))
            ev.sampled_format = sum(formats) / len(formats) if formats else None
            if trajs:
                await model.log([art.TrajectoryGroup(trajs)], split=split)
            report.evaluations.append(ev)
            return ev

        report = Report(model=name, server=toolset.label, steps=cfg.steps, folder=str(folder))
        old = _load_report(folder)
        history = report.rows = list(old.get("rows", []))
        report.evaluations = [Evaluation.model_validate(e) for e in old.get("evaluations", [])]
        report.val_reward_untrained = old.get("val_reward_untrained")
        if await model.get_step() == 0 and not history:
            # The untrained model first, so the report can tell what training did.
            untrained = await evaluate(0, 0, "untrained")
            report.val_reward_untrained = untrained.greedy_reward
            log(f"untrained: held-out {_eval_line(untrained)}")
            demos = _demonstrations(sft, train_set, tools)
            if demos and cfg.sft_epochs > 0:
                res = await model.train_sft(
                    demos,
                    art.TrainConfig(learning_rate=cfg.sft_learning_rate),
                    epochs=cfg.sft_epochs,
                    batch_size=8,
                )
                log(
                    f"SFT warm start on {len(demos)} demonstrations: loss {res.metrics['sft_loss_first']:.2f} -> {res.metrics['sft_loss_last']:.2f}"
                )
        start_step = await model.get_step()
        if not history:
            if start_step == 0 and report.evaluations:
                before = report.evaluations[-1]  # no warm start: the untrained evaluation
            else:
                before = await evaluate(start_step, 0)
                log(f"RL step 0 (before RL): held-out {_eval_line(before)}")
            report.rows.append(
                {
                    "step": float(start_step),
                    "rl_step": 0.0,
                    "train_reward": float("nan"),
                    **_eval_row(before),
                }
            )
        grpo_done = _grpo_steps_done(folder, report.rows)
        epochs = 1 + (cfg.steps * cfg.groups_per_step) // max(len(train_set), 1)
        batches = iterate_dataset(
            train_set,
            groups_per_step=cfg.groups_per_step,
            num_epochs=epochs,
            seed=cfg.seed,
            initial_step=grpo_done,
        )
        for batch in batches:
            if batch.step >= cfg.steps:
                break
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(s) for _ in range(cfg.group_size))
                    for s in batch.items
                ),
                progress=False,
                max_exceptions=0.5,
                after_each=judge,
            )
            if cfg.shuffle_rewards:
                _shuffle_rewards(groups, random.Random(f"{cfg.seed}/{batch.step}"))
            result = await model.train(
                groups,
                art.TrainConfig(
                    learning_rate=cfg.learning_rate, micro_batch_tokens=cfg.micro_batch_tokens
                ),
            )
            train_reward = result.metrics.get("reward", float("nan"))
            row: dict[str, float] = {
                "step": float(result.step),
                "rl_step": float(batch.step + 1),
                "val_reward": float("nan"),
                "train_reward": train_reward,
                "zero_variance_groups": result.metrics.get("zero_variance_groups", float("nan")),
                "seconds": time.perf_counter() - t0,
            }
            done = batch.step + 1
            if done == cfg.steps or (cfg.eval_every and done % cfg.eval_every == 0):
                ev = await evaluate(result.step, done)
                row.update(_eval_row(ev))
                held = _eval_line(ev)
            else:
                held = "-"
            report.rows.append(row)
            log(f"RL step {done}: train reward {train_reward:.2f}, held-out {held}")
        vals = [r["val_reward"] for r in report.rows if _ok(r.get("val_reward"))]
        report.val_reward_before = vals[0] if vals else None
        report.val_reward_after = vals[-1] if vals else None
        report.val_reward_best = max(vals[1:]) if len(vals) > 1 else None
        report.seconds = time.perf_counter() - t0
        rl_evals = [e for e in report.evaluations if e.rl_step > 0]
        if report.evaluations and rl_evals:
            first, last = report.evaluations[0], rl_evals[-1]
            report.paired = {k: paired_rise(first, last, k) for k in ("greedy", "sampled")}
            report.examples = changed_examples(first, last, val_set)
        _write_report(report, folder)
        log(f"report: {folder / 'report.md'}")
        return report
    finally:
        await toolset.close()
        if own_backend:
            await backend.close()


async def _scenarios(
    given: list[Scenario] | str | Path | None,
    cfg: HarnessConfig,
    toolset: MCPToolset,
    model: art.Model,
    folder: Path,
    log: Callable[[str], None],
) -> list[Scenario]:
    if isinstance(given, list):
        return given
    if given is not None:
        return load_scenarios(given)
    saved = folder / "scenarios.jsonl"
    if saved.exists():  # a resumed run keeps its scenarios
        return load_scenarios(saved)
    generator = cfg.generator
    if generator is None:
        log(
            "no --scenarios and no --generator: generating scenarios with the model being "
            "trained (--generator local); a stronger generator writes better ones"
        )
        generator = "local"
    base_url = api_key = None
    source = generator
    if generator == "local":
        generator, base_url, api_key = (
            f"openai/{model.name}",
            model.inference_base_url,
            model.inference_api_key,
        )
    scen = await generate_scenarios(
        toolset, cfg.n_scenarios, generator=generator, base_url=base_url, api_key=api_key
    )
    save_scenarios(saved, scen)
    log(f"generated {len(scen)} scenarios with {source} -> {saved}")
    return scen


def _demonstrations(
    sft: list[Any] | str | Path | None, scen: list[Scenario], tools: list[Any]
) -> list[Any]:
    """SFT items: the given ones (a list or a JSONL file), else the train scenarios'
    demonstrations. A conversation without its own `tools` is rendered with the agent's
    system prompt and tool specs, so the warm start sees exactly what the agent will."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    specs = [convert_to_openai_tool(t) for t in tools]

    def agent_view(item: Any) -> Any:
        if isinstance(item, dict) and "tools" in item:
            return item  # a full item (messages + tools): used as it is
        messages = list(item["messages"] if isinstance(item, dict) else item)
        if not messages or messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": SYSTEM})
        return {"messages": messages, "tools": specs}

    if isinstance(sft, str | Path):
        lines = Path(sft).read_text().splitlines()
        try:
            sft = [json.loads(line) for line in lines if line.strip()]
        except ValueError as exc:
            raise UsageError(f"{sft}: not JSONL ({exc})") from None
    if sft is not None:
        return [agent_view(item) for item in sft]
    return [agent_view(s.demonstration) for s in scen if s.demonstration]


def _judge(cfg: HarnessConfig, model: art.Model) -> Any:
    if cfg.judge is None:
        return None
    from art_langgraph.rewards import DEFAULT_RUBRIC, ruler_score_group

    judge, base_url, api_key = cfg.judge, None, None
    if judge == "local":
        judge, base_url, api_key = (
            f"openai/{model.name}",
            model.inference_base_url,
            model.inference_api_key,
        )
    return functools.partial(
        ruler_score_group,
        judge=judge,
        base_url=base_url,
        api_key=api_key,
        rubric=cfg.rubric or DEFAULT_RUBRIC,
        swallow_exceptions=True,
    )


def _grpo_steps_done(folder: Path, rows: list[dict[str, Any]]) -> int:
    """GRPO steps already trained in this model's folder (SFT steps are not counted); with a
    remote backend (no history here), the last RL step of the previous report."""
    f = folder / "history.jsonl"
    if not f.exists():
        return max((int(r.get("rl_step") or 0) for r in rows), default=0)
    done = 0
    for line in f.read_text().splitlines():
        try:
            h = json.loads(line)
        except ValueError:
            continue
        done += h.get("split") == "train" and "sft_steps" not in h
    return done


def _shuffle_rewards(groups: list[art.TrajectoryGroup], rng: random.Random) -> None:
    """The control arm: the step's rewards, permuted across all of its rollouts."""
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajs]
    rng.shuffle(rewards)
    for t, r in zip(trajs, rewards, strict=True):
        t.reward = r


def _eval_row(ev: Evaluation) -> dict[str, float]:
    s = ev.summary()
    return {
        "val_reward": ev.greedy_reward,
        "val_greedy_success": s["greedy_success"],
        "val_sampled_success": s["sampled_success"],
        "val_format": s["sampled_format"] if ev.sampled else s["greedy_format"],
    }


def _eval_line(ev: Evaluation) -> str:
    s = ev.summary()
    line = f"greedy success {_fmt(s['greedy_success'])}"
    if ev.sampled:
        line += (
            f", sampled success {_fmt(s['sampled_success'])}, format {_fmt(s['sampled_format'])}"
        )
    return line + f" (reward {_fmt(s['greedy_reward'])})"


def _fmt(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.2f}"


def summary_lines(report: Report) -> list[str]:
    """The report's headline: held-out success of the untrained model, after any warm
    start, after RL; the paired rise; the wall time."""
    evs = report.evaluations
    if not evs:
        return [f"- wall time: {report.seconds:.0f} s"]
    n = len(evs[0].greedy)
    k = max((len(v) for v in evs[0].sampled.values()), default=0)
    out = [
        f"- held-out: {n} scenarios never trained on; greedy, and {k} samples at temperature 1"
        if k
        else f"- held-out: {n} scenarios never trained on, greedy"
    ]
    for ev in evs:
        label = (
            "untrained"
            if ev.step == 0
            else (
                "before RL (after the warm start)"
                if ev.rl_step == 0
                else f"after RL step {ev.rl_step}"
            )
        )
        out.append(f"- {label}: {_eval_line(ev)}")
    for kind in ("sampled", "greedy"):
        p = report.paired.get(kind)
        if p and _ok(p.get("rise")):
            out.append(
                f"- paired rise in {kind} success, untrained -> last: {p['rise']:+.2f} "
                f"(± {_fmt(p['se'])} s.e., {int(p['n'])} scenarios)"
            )
    rl = [e for e in evs if e.rl_step > 0]
    before = [e for e in evs if e.rl_step == 0]
    if rl and before:
        share = rl[-1].greedy_reward - before[-1].greedy_reward
        out.append(f"- RL's own contribution to the greedy reward: {share:+.2f}")
    out.append(f"- wall time: {report.seconds:.0f} s")
    return out


def _load_report(folder: Path) -> dict[str, Any]:
    """The previous run's report.json as plain JSON (rows hold null where not evaluated)."""
    f = folder / "report.json"
    try:
        data = json.loads(f.read_text()) if f.exists() else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _ok(x: float | None) -> bool:
    return x is not None and x == x


def _example_lines(report: Report) -> list[str]:
    if not report.examples:
        return []
    out = ["", "## Held-out episodes that changed (greedy, untrained -> last)", ""]
    for ex in report.examples:
        out += [
            f"**{ex['task']}**",
            "",
            f"- before (reward {_fmt(ex['before_reward'])}): `{ex['before']}`",
            f"- after (reward {_fmt(ex['after_reward'])}): `{ex['after']}`",
            "",
        ]
    return out


def _write_report(report: Report, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)

    def put(name: str, text: str) -> None:
        with atomic_write(folder / name) as f:
            f.write(text)

    put("report.json", report.model_dump_json(indent=2))
    lines = [
        f"# {report.model} over `{report.server}`",
        "",
        *summary_lines(report),
        "",
        "| RL step | train reward | held-out reward |",
        "|---:|---:|---:|",
        *(
            f"| {int(r.get('rl_step', r['step']))} | {_fmt(r.get('train_reward'))} | {_fmt(r.get('val_reward'))} |"
            for r in report.rows
        ),
        "",
        "![reward curve](reward_curve.png)",
        *_example_lines(report),
    ]
    put("report.md", "\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)

        def x(r: dict[str, float]) -> float:
            return r.get("rl_step", r["step"])

        pts = [(x(r), r["val_reward"]) for r in report.rows if _ok(r.get("val_reward"))]
        tr = [(x(r), r["train_reward"]) for r in report.rows if _ok(r.get("train_reward"))]
        if tr:
            ax.plot(*zip(*tr, strict=True), marker="o", label="train reward")
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="s", label="held-out reward")
        if (untrained := report.val_reward_untrained) is not None and _ok(untrained):
            ax.axhline(untrained, color="grey", ls=":", label="untrained")
        ax.set_xlabel("RL step (0: before RL)")
        ax.set_ylabel("reward")
        ax.set_title(f"{report.model}: GRPO over MCP")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        with atomic_write(folder / "reward_curve.png", "wb") as f:
            fig.savefig(f, format="png")
        plt.close(fig)
    except ImportError:  # matplotlib is optional: the JSON and markdown reports are written anyway
        pass
