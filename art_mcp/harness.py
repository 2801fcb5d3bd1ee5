"""`art_mcp.train`: from an MCP server to a trained agent, with no training code of yours.

It connects to the server (`MCPToolset`), loads or generates scenarios and splits them
train/val, registers a trainable model on an embedded `LocalBackend` (resuming from its
checkpoints after a restart), optionally warm-starts it with SFT on demonstrations, and
then runs GRPO steps: a LangGraph agent (`create_agent`) over the server's tools plus a
`complete_task(answer)` tool that ends the run, `max_turns` at most, each rollout
captured; groups scored by your reward function and/or RULER (`shuffle_rewards`: the
control arm); `model.train`. The held-out scenarios are evaluated before RL and after
the last step, greedy and sampled (`art_mcp.evaluation`), scored as training scores (the
reward function, else the judge). What is done is saved as it happens, so the same command
resumes an interrupted run and the report (`art_mcp.report`: JSON, markdown with changed
episodes, a reward curve PNG in the model's folder) is rebuilt from what was saved. A reward
function that raises is counted and shown per step; a step that trained on nothing says so.

Left out: multi-server toolsets and tool allow-lists (wrap your server instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib
import inspect
import json
import math
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

import art_langgraph as art
from art_langgraph.backend.base import Backend
from art_langgraph.errors import UsageError
from art_langgraph.utils import atomic_write, iterate_dataset
from art_mcp.evaluation import Evaluation, episode_format, transcript
from art_mcp.report import (
    Report,
    append_journal,
    build_report,
    eval_line,
    grpo_steps,
    journal_evaluations,
    read_journal,
    summary_lines,
    write_report,
)
from art_mcp.scenarios import (
    Scenario,
    generate_scenarios,
    load_scenarios,
    save_scenarios,
    split_scenarios,
)
from art_mcp.toolset import MCPToolset

__all__ = [
    "HarnessConfig",
    "Report",
    "default_name",
    "eval_sample",
    "load_reward",
    "summary_lines",
    "train",
    "write_scenarios",
]

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
            "Model name; default: 'agent-' + a hash of the server command, base model, "
            "scenarios, reward and judge, the same in every process, so running the same "
            "command again resumes and changing the recipe starts another model."
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
    scenario_tool_words: bool = Field(
        True,
        description=(
            "Drop generated tasks that name nothing the tools can reach (no word of a tool's "
            "name, description, parameters or enum values); the check is by words, so a "
            "task that reaches a tool through a synonym is dropped too: turn it off then."
        ),
    )
    instructions: str = Field(
        "",
        description=(
            "Steers the scenario generator: what the tasks should be about, their style, what "
            "to avoid (added to its prompt)."
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
    allow_tools: list[str] | None = Field(
        None,
        description=(
            "Offer the agent only these tools of the server (comma-separated on the command "
            "line); None: all of them. A name the server does not list is an error."
        ),
    )
    deny_tools: list[str] = Field(
        default_factory=list,
        description=(
            "Never offer these tools (comma-separated): a live server's write or delete tools, "
            "say. A name the server does not list is an error."
        ),
    )
    server_per: Literal["run", "rollout"] = Field(
        "run",
        description=(
            "'run': one server process for the whole run; tools that change its state act on "
            "the live server, and later rollouts and the held-out evaluation see the changes. "
            "'rollout': a fresh server process for every rollout and held-out episode (one "
            "start-up each), so each starts from the same world; needs a server command."
        ),
    )
    max_servers: int = Field(
        16,
        ge=1,
        description=(
            "With server_per='rollout': the most server processes alive at once; rollouts "
            "beyond it wait for one to end (each process costs its own memory)."
        ),
    )
    workdir: str | None = Field(
        None,
        description=(
            "A folder the server works on: '{workdir}' in the server command becomes a fresh "
            "copy of it for every server started (the run's, or each rollout's with "
            "server_per='rollout'), so the folder itself is never changed."
        ),
    )
    allow_recipe_change: bool = Field(
        False,
        description=(
            "Resume a model whose saved recipe (server, base model, scenarios, reward, judge) "
            "differs from this run's; by default such a run stops and says what changed."
        ),
    )
    promote_on_evaluation: bool = Field(
        False,
        description=(
            "Gate the model's bare name on the held-out evaluations: it serves the last step "
            "whose greedy held-out reward was at least the promoted step's minus "
            "ModelConfig.promotion_tolerance (each evaluation is recorded with "
            "model.record_evaluation); rollouts use the latest step."
        ),
    )
    review_queue: str | None = Field(
        None,
        description=(
            "Langfuse annotation queue (made if missing; LANGFUSE_* keys) that gets a sample "
            "of every RL step's rollouts for human review (langfuse_review.py: a seeded "
            "--review-fraction, the judge-vs-reward disagreements, the borderline ones); "
            "the report then gives the judge's agreement with the reviews. None: no review."
        ),
    )
    review_fraction: float = Field(
        0.1, ge=0, le=1, description="Share of each step's rollouts sent to --review-queue."
    )

    @field_validator("allow_tools", "deny_tools", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [n.strip() for n in value.split(",") if n.strip()]
        return value


def default_name(server_label: str, base_model: str, recipe: dict[str, Any] | None = None) -> str:
    """The model name when none is given: a hash of the server, the base model and the rest
    of the recipe (`recipe`: scenarios, reward, judge), the same in every process. Running
    the same command again resumes; changing the recipe starts another model."""
    text = f"{server_label}\n{base_model}"
    if recipe:
        text += "\n" + json.dumps(recipe, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"agent-{digest[:10]}"


def recipe_of(
    server_label: str,
    cfg: HarnessConfig,
    scenarios: list[Scenario] | None,
    reward: RewardFn | str | None,
) -> dict[str, Any]:
    """What makes two runs the same training: the server, base model, scenarios (a hash of
    their content, or how they are generated), reward function and judge."""
    if scenarios is not None:
        scen = _digest("\n".join(s.model_dump_json() for s in scenarios))
    else:
        scen = f"generated by {cfg.generator or 'local'} ({cfg.n_scenarios})"
    if reward is None or isinstance(reward, str):
        rew = reward
    else:
        rew = f"{getattr(reward, '__module__', '?')}:{getattr(reward, '__qualname__', '?')}"
    return {
        "server": server_label,
        "base_model": cfg.base_model,
        "scenarios": scen,
        "reward": rew,
        "judge": cfg.judge,
        "rubric": _digest(cfg.rubric) if cfg.rubric else None,
    }


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_recipe(folder: Path, recipe: dict[str, Any], allow_change: bool) -> None:
    """Save the recipe beside a new model; refuse to resume one trained with another."""
    f = folder / "recipe.json"
    try:
        saved = json.loads(f.read_text()) if f.exists() else None
    except ValueError:
        saved = None
    if isinstance(saved, dict) and saved != recipe:
        changed = sorted(k for k in {*saved, *recipe} if saved.get(k) != recipe.get(k))
        if not allow_change:
            raise UsageError(
                f"{folder.name} was trained with another recipe ({', '.join(changed)} changed: "
                f"{', '.join(f'{k} {saved.get(k)!r} -> {recipe.get(k)!r}' for k in changed)}); "
                "give another --name, or --allow-recipe-change true to go on training it"
            )
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(f) as out:
        out.write(json.dumps(recipe, indent=2))


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


async def _langfuse_run(
    name: str,
    cfg: HarnessConfig,
    step: int,
    rl_step: int,
    folder: Path,
    jobs: list[tuple[Scenario, bool]],
    trajs: list[art.Trajectory],
    log: Callable[[str], None],
) -> None:
    """When Langfuse is configured (`LANGFUSE_PUBLIC_KEY`/`LANGFUSE_SECRET_KEY`, not
    `ART_LANGFUSE=0`): the evaluation as the run `name@step` of the dataset
    `{project}-{name}-held-out` (art_langgraph/integrations/langfuse_datasets.py). Fail-soft;
    a dataset or score-config name clash stops the run with its error."""
    env = os.environ.get
    if env("ART_LANGFUSE", "1") == "0" or not (
        env("LANGFUSE_PUBLIC_KEY") and env("LANGFUSE_SECRET_KEY")
    ):
        return
    try:
        from art_langgraph.integrations.langfuse_datasets import log_evaluation
    except ImportError:
        return  # the backend's logger already said the extra is missing
    res = await asyncio.to_thread(
        log_evaluation,
        dataset=f"{cfg.project}-{name}-held-out",
        run_name=f"{name}@{step}",
        items=[(s, t) for (s, _), t in zip(jobs, trajs, strict=True)],
        success_reward=cfg.success_reward,
        metadata={"model": name, "step": step, "rl_step": rl_step},
        folder=folder,
    )
    if res.sent:
        log(f"Langfuse: held-out evaluation at step {step} is dataset run {name}@{step}")


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
    out = float(value)
    if not math.isfinite(out):
        raise UsageError(f"the reward function returned {out} (a reward must be a finite number)")
    return out


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
    log = log or _say
    is_command = isinstance(server, list | tuple) or (
        isinstance(server, str) and not server.startswith(("http://", "https://"))
    )
    if (cfg.server_per == "rollout" or cfg.workdir is not None) and not is_command:
        raise UsageError(
            "server_per='rollout' and workdir start server processes: give the server as a "
            "command, not a URL or an object"
        )
    if cfg.workdir is not None:
        if not Path(cfg.workdir).is_dir():
            raise UsageError(f"workdir {cfg.workdir!r} is not a folder")
        if "{workdir}" not in (server if isinstance(server, str) else " ".join(server)):
            raise UsageError("workdir is given but the server command has no '{workdir}' in it")
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

        check_base_model(cfg.base_model)  # before any server or engine starts
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
    server_log.parent.mkdir(parents=True, exist_ok=True)
    server_log.write_bytes(b"")  # this run's: a failure quotes nothing of an earlier run
    copies = _WorkdirCopies(cfg.workdir)

    def new_toolset() -> MCPToolset:
        return MCPToolset(
            copies.command(server),
            env=env,
            stderr_log=server_log,
            allow_tools=cfg.allow_tools,
            deny_tools=cfg.deny_tools,
        )

    servers = asyncio.Semaphore(cfg.max_servers)

    @contextlib.asynccontextmanager
    async def world() -> AsyncIterator[None]:
        """Where one rollout's tool calls go: the run's server, or one of its own."""
        if cfg.server_per == "run":
            yield
            return
        async with servers:
            own = new_toolset()
            try:
                await own.start()
                with toolset.routed_to(own):
                    yield
            finally:
                await own.close()
                copies.release(own.server)

    toolset = new_toolset()
    phase = "start-up"
    try:
        await toolset.start()
        if toolset.stderr_log is not None:
            log(f"the server's stderr goes to {toolset.stderr_log}")
        label = _label(server)
        recipe = recipe_of(label, cfg, scenarios, reward)
        name = cfg.name or default_name(label, cfg.base_model, recipe)
        if cfg.name is None:
            log(
                f"model name {name} (from the server, base model, scenarios, reward and judge; --name sets one)"
            )
        model = art.TrainableModel(
            name=name,
            project=cfg.project,
            base_model=cfg.base_model,
            training=art.ModelConfig(
                compute_dtype=cfg.compute_dtype, promote_on_evaluation=cfg.promote_on_evaluation
            ),
        )
        await model.register(backend)
        # The harness's own files (scenarios, report) go beside the checkpoints when the
        # backend is embedded, under --path here when it is remote.
        folder = Path(getattr(backend, "path", cfg.path)) / cfg.project / "models" / name
        _check_recipe(folder, recipe, cfg.allow_recipe_change)
        if cfg.review_queue:  # a clashing queue or missing keys stop here, before any rollout
            from art_langgraph.integrations import langfuse_review

            langfuse_review.check_queue(cfg.review_queue)
        scen = await _scenarios(scenarios, cfg, toolset, model, folder, log)
        train_set, val_set = split_scenarios(scen, cfg.val_fraction, cfg.seed)
        held_out = len(val_set)
        val_set = eval_sample(val_set, cfg.eval_scenarios, cfg.seed)
        evaluated = "" if len(val_set) == held_out else f" ({len(val_set)} evaluated)"
        log(
            f"{len(toolset.tools)} tools from {label}; {len(train_set)} train / "
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

        reward_errors = _RewardErrors()

        async def rollout(
            s: Scenario, agent: Any = train_agent, *, held_out: bool = False
        ) -> art.Trajectory:
            async with world():
                with art.capture(metadata={"scenario": s.id}) as traj:
                    try:
                        await agent.ainvoke(
                            # A turn is two graph steps (the model, then its tools): this
                            # many steps allow `max_turns` model calls, no more.
                            {"messages": [("user", s.task)]},
                            {"recursion_limit": 2 * cfg.max_turns},
                        )
                    except Exception as exc:  # out of turns, a broken graph: scored, not fatal
                        traj.log(f"rollout stopped: {exc!r}")
            traj.metadata["answer"] = final_answer(traj)
            try:
                traj.reward = await _score(reward_fn, traj, s)
            except Exception as exc:
                reward_errors.add(exc)
                if not held_out:  # a training rollout without a reward is dropped, and counted
                    raise UsageError(
                        f"the reward function failed on scenario {s.id!r}: {exc!r}"
                    ) from exc
                traj.reward = 0.0  # held out: scored as a failure, so evaluation goes on
                traj.metadata["reward_error"] = repr(exc)
            return traj

        judge_params = _judge_params(cfg, model)
        judge = _judge(judge_params)
        scored_by = (
            "reward function"
            if judge_params is None
            else "RULER judge"
            if reward_fn is None
            else "RULER judge, as in training (the reward function's score kept per episode)"
        )

        def report_errors(where: str) -> None:
            count, first = reward_errors.take()
            if count:
                what = "dropped" if where.startswith("RL") else "scored 0"
                log(f"{where}: the reward function raised in {count} episodes ({what}); first:")
                log(first)

        async def evaluate(step: int, rl_step: int) -> Evaluation:
            ev = Evaluation(step=step, rl_step=rl_step, success_reward=cfg.success_reward)
            tick = time.perf_counter()
            jobs = [(s, True) for s in val_set]
            jobs += [(s, False) for s in val_set for _ in range(cfg.eval_samples)]
            trajs = await asyncio.gather(
                *(
                    rollout(s, greedy_agent if greedy else sample_agent, held_out=True)
                    for s, greedy in jobs
                )
            )
            log(
                f"held-out evaluation at step {step}: {len(trajs)} episodes in "
                f"{time.perf_counter() - tick:.0f} s"
            )
            report_errors(f"held-out evaluation at step {step}")
            if judge_params is not None:
                by_scenario: dict[str, list[art.Trajectory]] = {}
                for (s, _), t in zip(jobs, trajs, strict=True):
                    by_scenario.setdefault(s.id, []).append(t)
                failed = await _judge_held_out(list(by_scenario.values()), judge_params)
                if failed:
                    log(
                        f"held-out evaluation at step {step}: the judge failed on {failed} of "
                        f"{len(by_scenario)} scenarios (their episodes keep the reward function's "
                        "score, or 0)"
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
                split = "untrained" if step == 0 else "val"
                await model.log([art.TrajectoryGroup(trajs)], split=split)
                await _langfuse_run(name, cfg, step, rl_step, folder, jobs, trajs, log)
            append_journal(folder, "evaluation", json.loads(ev.model_dump_json()))
            if cfg.promote_on_evaluation and math.isfinite(ev.greedy_reward):
                decision = await model.record_evaluation(step, ev.greedy_reward)
                log(
                    f"promotion: step {step} {'' if decision.promoted else 'not '}promoted: {decision.reason}"
                )
            return ev

        def save_report() -> Report:
            report = build_report(
                model=name,
                server=label,
                steps=cfg.steps,
                folder=folder,
                scored_by=scored_by,
                seconds=time.perf_counter() - t0,
                scenarios=val_set,
            )
            write_report(report, folder)
            return report

        # What is already done comes from the folder (report.py), so a resumed run goes
        # on from where the last one stopped, whatever phase that was.
        evaluations = journal_evaluations(read_journal(folder))
        grpo_done = len(grpo_steps(folder, read_journal(folder)))
        if await model.get_step() == 0 and grpo_done == 0:
            if not any(e.step == 0 for e in evaluations):
                phase = "the untrained model's held-out evaluation"
                # The untrained model first, so the report can tell what training did.
                untrained = await evaluate(0, 0)
                evaluations.append(untrained)
                log(f"untrained: held-out {eval_line(untrained)}")
                save_report()
            demos = _demonstrations(sft, train_set, tools)
            if demos and cfg.sft_epochs > 0:
                phase = "the SFT warm start"
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
        if grpo_done == 0 and not any(e.rl_step == 0 and e.step == start_step for e in evaluations):
            phase = "the held-out evaluation before RL"
            before = await evaluate(start_step, 0)
            evaluations.append(before)
            log(f"RL step 0 (before RL): held-out {eval_line(before)}")
        save_report()
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
            done = batch.step + 1
            phase = f"RL step {done}"
            tick = time.perf_counter()
            judged = _Counted(judge)
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(s) for _ in range(cfg.group_size))
                    for s in batch.items
                ),
                pbar_desc=f"RL step {done} rollouts",
                progress=_terminal(),
                max_exceptions=0.5,
                after_each=judged if judge is not None else None,
            )
            n = sum(len(g.trajectories) for g in groups)
            line = f"RL step {done}: {n} of {len(batch.items) * cfg.group_size} rollouts"
            if judge is not None:
                line += f", {judged.calls} groups judged ({judged.dropped} dropped)"
            log(f"{line} in {time.perf_counter() - tick:.0f} s; training")
            report_errors(f"RL step {done}")
            if cfg.shuffle_rewards:
                _shuffle_rewards(groups, random.Random(f"{cfg.seed}/{batch.step}"))
            tick = time.perf_counter()
            with _TrainingProgress(f"RL step {done} training") as progress:
                result = await model.train(
                    groups,
                    art.TrainConfig(
                        learning_rate=cfg.learning_rate, micro_batch_tokens=cfg.micro_batch_tokens
                    ),
                    progress=progress,
                )
            log(
                f"RL step {done}: trained {progress.micro_batches} micro-batches "
                f"({progress.tokens} tokens) in {time.perf_counter() - tick:.0f} s"
            )
            if cfg.review_queue:  # fail-soft: what is not sent is recorded for re-sending
                await asyncio.to_thread(
                    langfuse_review.send_to_review,
                    groups,
                    queue=cfg.review_queue,
                    fraction=cfg.review_fraction,
                    seed=cfg.seed,
                    folder=folder,
                    split="train",
                    step=result.step,
                )
            m = result.metrics
            append_journal(
                folder,
                "step",
                {"step": result.step, **{k: m[k] for k in _STEP_KEYS if k in m}},
            )
            train_reward = m.get("reward", float("nan"))
            if done == cfg.steps or (cfg.eval_every and done % cfg.eval_every == 0):
                held = eval_line(await evaluate(result.step, done))
            else:
                held = "-"
            log(
                f"RL step {done}: train reward {train_reward:.2f}{_trained_note(m, judge_params)}, "
                f"held-out {held}"
            )
            save_report()
        grpo_done = len(grpo_steps(folder, read_journal(folder)))
        step = await model.get_step()
        evaluations = journal_evaluations(read_journal(folder))
        if grpo_done and grpo_done >= cfg.steps and not any(e.step == step for e in evaluations):
            # The last step's evaluation was cut off by an interrupt: run it now.
            phase = f"the held-out evaluation after RL step {grpo_done}"
            ev = await evaluate(step, grpo_done)
            log(f"RL step {grpo_done}: held-out {eval_line(ev)}")
        if cfg.review_queue and judge_params is not None:
            try:  # the judge against the reviews so far (review_calibration.json), and as
                # scores of the last evaluation's dataset run
                from art_langgraph.integrations.langfuse_datasets import last_run_id

                await asyncio.to_thread(
                    langfuse_review.calibrate,
                    folder,
                    queue=cfg.review_queue,
                    dataset_run_id=last_run_id(folder),
                )
            except Exception as exc:
                log(f"judge calibration against {cfg.review_queue!r} not computed: {exc}")
        report = save_report()
        log(f"report: {folder / 'report.md'}")
        return report
    except (asyncio.CancelledError, KeyboardInterrupt):
        # Ctrl-C: one line, not the tracebacks of every task it cancelled.
        log(
            f"interrupted during {phase}; what finished is saved (checkpoints, evaluations): "
            "run the same command to resume"
        )
        raise
    finally:
        await toolset.close()
        copies.release_all()
        if own_backend:
            await backend.close()


def _say(line: str) -> None:
    """The default log: stdout, flushed line by line (a pipe or a file sees each line)."""
    print(line, flush=True)


def _label(server: Any) -> str:
    """The server as the user gave it (a workdir's copies do not change a model's name)."""
    if isinstance(server, str):
        return server
    if isinstance(server, list | tuple):
        return shlex.join(server)
    return type(server).__name__


class _WorkdirCopies:
    """Fresh copies of the run's workdir, one per server started, removed when it ends."""

    def __init__(self, workdir: str | None) -> None:
        self.workdir = workdir
        self.made: dict[str, str] = {}  # the command -> its copy

    def command(self, server: Any) -> Any:
        """`server` with '{workdir}' replaced by a new copy (unchanged without a workdir)."""
        if self.workdir is None:
            return server
        root = tempfile.mkdtemp(prefix="art-mcp-workdir-")
        copy = os.path.join(root, Path(self.workdir).name or "workdir")
        shutil.copytree(self.workdir, copy, symlinks=True)
        if isinstance(server, str):
            cmd: Any = server.replace("{workdir}", shlex.quote(copy))
            self.made[cmd] = root
        else:
            cmd = [a.replace("{workdir}", copy) for a in server]
            self.made[shlex.join(cmd)] = root
        return cmd

    def release(self, command: Any) -> None:
        key = command if isinstance(command, str) else shlex.join(command)
        if (root := self.made.pop(key, None)) is not None:
            shutil.rmtree(root, ignore_errors=True)

    def release_all(self) -> None:
        for root in self.made.values():
            shutil.rmtree(root, ignore_errors=True)
        self.made.clear()


_STEP_KEYS = ("reward", "zero_variance_groups", "groups", "nothing_trainable", "trajectories")
"""The train metrics a journal step line keeps (report.py rebuilds rows from them)."""


def _trained_note(m: dict[str, float], judge_params: dict[str, Any] | None) -> str:
    """What a step trained on, when it is not every group: "(2 of 8 groups had one reward
    for all their rollouts)", or why it trained on nothing."""
    groups = int(m.get("groups", 0))
    zv = int(m.get("zero_variance_groups", 0))
    if m.get("nothing_trainable"):
        if groups and zv == groups:
            who = "the judge" if judge_params is not None else "the reward function"
            why = f"in every group, {who} gave all rollouts the same score"
        elif m.get("stale_groups"):
            why = "its groups were sampled from adapters older than max_staleness allows"
        else:
            why = "no rollout had a trainable token (every group empty or without variance)"
        return f" - TRAINED ON NOTHING: {why}; the step advances with the adapter unchanged"
    if zv:
        return f" ({zv} of {groups} groups had one reward for all rollouts: not trained on)"
    return ""


def _terminal() -> bool:
    """Whether progress bars can draw: stderr is a terminal."""
    return sys.stderr.isatty()


class _Counted:
    """The judge as `after_each`, counting its calls and the groups it dropped."""

    def __init__(self, judge: Any) -> None:
        self.judge = judge
        self.calls = self.dropped = 0

    async def __call__(self, group: art.TrajectoryGroup) -> Any:
        self.calls += 1
        out = await self.judge(group)
        self.dropped += out is None
        return out


class _TrainingProgress:
    """The trainer's `progress` callback (called from its thread): trained tokens so far,
    as a bar on a terminal; the totals for the line after the step."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.micro_batches = self.tokens = 0
        self.bar: Any = None

    def __enter__(self) -> _TrainingProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def __call__(self, stage: str, info: dict[str, Any]) -> None:
        if stage != "micro_batch":
            return
        self.micro_batches += 1
        self.tokens += int(info.get("tokens", 0))
        if _terminal():
            if self.bar is None:
                from tqdm.auto import tqdm

                total = int(info.get("total_tokens", 0)) or None
                self.bar = tqdm(total=total, desc=self.desc, unit="tok", dynamic_ncols=True)
            self.bar.update(int(info.get("tokens", 0)))


class _RewardErrors:
    """Exceptions of the reward function in one phase: counted, the first traceback kept."""

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


async def _judge_held_out(groups: list[list[art.Trajectory]], params: dict[str, Any]) -> int:
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
        generator, base_url, api_key = _route(model)
    scen = await _generate(toolset, cfg, (generator, base_url, api_key), log)
    save_scenarios(saved, scen)
    log(f"generated {len(scen)} scenarios with {source} -> {saved}")
    return scen


async def _generate(
    toolset: MCPToolset,
    cfg: HarnessConfig,
    route: tuple[str, str | None, str | None],
    log: Callable[[str], None],
) -> list[Scenario]:
    """`generate_scenarios` with the run's settings; `route`: the generator, its base URL
    and key, as litellm takes them."""
    generator, base_url, api_key = route
    return await generate_scenarios(
        toolset,
        cfg.n_scenarios,
        generator=generator,
        base_url=base_url,
        api_key=api_key,
        instructions=cfg.instructions,
        require_tool_words=cfg.scenario_tool_words,
        log=log,
    )


async def write_scenarios(
    server: Any,
    out: str | Path,
    config: HarnessConfig | None = None,
    *,
    env: dict[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Scenario]:
    """Generate `config.n_scenarios` scenarios for `server`'s tools, write them to `out`
    (JSONL) and stop, so a person can read and edit them before training
    (`art-mcp scenarios`). The generator is `config.generator`; 'local' (the default) is
    `config.base_model` served by an embedded backend."""
    cfg = config or HarnessConfig()
    say = log or _say
    out = Path(out)
    generator = cfg.generator or "local"
    if generator == "local":
        from art_langgraph.presets import check_base_model

        check_base_model(cfg.base_model)
    toolset = MCPToolset(server, env=env, allow_tools=cfg.allow_tools, deny_tools=cfg.deny_tools)
    backend: Backend | None = None
    try:
        await toolset.start()
        base_url = api_key = None
        if generator == "local":
            backend = art.LocalBackend(path=cfg.path, engine=cfg.engine)
            writer = art.Model(
                name="scenario-writer", project=cfg.project, base_model=cfg.base_model
            )
            await writer.register(backend)
            generator, base_url, api_key = _route(writer)
            say(
                f"writing scenarios with {cfg.base_model}: a small model writes weak tasks; "
                "--generator takes any litellm model (openai/gpt-4o-mini, ...)"
            )
        scen = await _generate(toolset, cfg, (generator, base_url, api_key), say)
    finally:
        await toolset.close()
        if backend is not None:
            await backend.close()
    save_scenarios(out, scen)
    for s in scen:
        say(f"- {s.task}")
    say(
        f"{len(scen)} scenarios for {len(toolset.tools)} tools -> {out}; review them, then "
        f"art-mcp train --scenarios {out} ..."
    )
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


def _route(model: art.Model) -> tuple[str, str | None, str | None]:
    """A model this run serves, as litellm reaches it: its name, base URL and key."""
    return f"openai/{model.name}", model.inference_base_url, model.inference_api_key


def _judge_params(cfg: HarnessConfig, model: art.Model) -> dict[str, Any] | None:
    """`ruler`'s judge, base_url, api_key and rubric for this run; None without a judge."""
    if cfg.judge is None:
        return None
    from art_langgraph.rewards import DEFAULT_RUBRIC

    judge, base_url, api_key = cfg.judge, None, None
    if judge == "local":
        judge, base_url, api_key = _route(model)
    return {
        "judge": judge,
        "base_url": base_url,
        "api_key": api_key,
        "rubric": cfg.rubric or DEFAULT_RUBRIC,
    }


def _judge(params: dict[str, Any] | None) -> Any:
    """The training groups' `after_each`: RULER over each group (None without a judge)."""
    if params is None:
        return None
    from art_langgraph.rewards import ruler_score_group

    return functools.partial(ruler_score_group, **params, swallow_exceptions=True)


def _shuffle_rewards(groups: list[art.TrajectoryGroup], rng: random.Random) -> None:
    """The control arm: the step's rewards, permuted across all of its rollouts."""
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajs]
    rng.shuffle(rewards)
    for t, r in zip(trajs, rewards, strict=True):
        t.reward = r
