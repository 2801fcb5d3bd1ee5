"""`HarnessConfig`: every knob of `art_mcp.train`, and the `art-mcp train` flags.

One source: the CLI builds its flags from these fields (art_mcp/cli.py) and the README's
table is generated from them (scripts/docs.py), so a field's description is its help text.

Left out: what the knobs do (harness.py runs the loop); the model's own training config
(`art.ModelConfig`, `art.TrainConfig`), of which only the fields a harness user tunes are
repeated here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from art_langgraph.training.config import (
    SWEPT_LEARNING_RATE,
    TrainConfig,
    default_learning_rate,
)

__all__ = ["SWEPT_LEARNING_RATE", "HarnessConfig", "default_learning_rate"]


DEFAULT_SFT_EPOCHS = 3
"""The warm start's epochs when `sft_epochs` is None and there are demonstrations: on the
two-hop task's validation slice one epoch taught the calls' shape but not their arguments,
three taught both (bench/results/warm_start)."""


class HarnessConfig(BaseModel):
    """Every knob of `art_mcp.train` (and the `art-mcp train` flags)."""

    base_model: str = Field(
        "smollm2-135m",
        description=(
            "A preset ('smollm2-135m': SmolLM2-135M-Instruct, the default; 'tiny': random "
            "weights, for unit tests only), a HF id, a local folder or a .gguf file."
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
        6,
        ge=0,
        description=(
            "GRPO steps to reach (a resumed run continues to this step count). 6 steps of 8 x 4 "
            "rollouts took SmolLM2-135M's sampled held-out success on the bundled task from "
            "0.17-0.29 to 0.67-0.85 over 5 seeds (a paired rise of +0.58 ± 0.08 sd, against "
            "+0.08 for a shuffled-reward control) in 17-21 min on 2 AVX2 CPU cores, "
            "evaluations included (docs/results.md)."
        ),
    )
    group_size: int = Field(4, ge=2, description="Rollouts per scenario in a group.")
    groups_per_step: int = Field(8, ge=1, description="Scenarios (groups) per step.")
    refill_groups: int = Field(
        0,
        ge=0,
        description=(
            "Dynamic sampling (DAPO's): a group whose rollouts all got one reward carries no "
            "GRPO signal and is not trained on; roll out another training scenario in its "
            "place, round after round, up to this many extra groups a step. Costs rollouts, "
            "not training: only groups with signal are trained on. 0: off."
        ),
    )
    max_turns: int = Field(
        6,
        ge=1,
        description=(
            "Most model turns in one rollout: 6 leaves room for two or three dependent "
            "lookups, a repeated call and the answer (chosen with after_repeat by a sweep of "
            "turn rules on three task shapes: bench/results/turn_rules; with 3, nearly every "
            "episode of a two-hop task ended on the forced answer). A failing rollout runs "
            "every turn, so each turn more costs rollout time on a task the model cannot yet "
            "do."
        ),
    )
    max_tokens: int = Field(96, ge=1, description="Most tokens per model turn.")
    temperature: float = Field(
        1.0,
        ge=0,
        description=(
            "Sampling temperature of the rollouts: 1, the policy as it is, which GRPO sharpens "
            "and the held-out evaluation samples. Swept on SmolLM2-135M (one seed each): 0.7, "
            "1 and 1.3 raised held-out sampled success by +0.60, +0.71 and +0.52 "
            "(bench/results/defaults_sweep/defaults_sweep.json)."
        ),
    )
    tool_choice: Literal["auto", "required"] = Field(
        "required",
        description=(
            "'required': every model turn is one tool call, constrained to the tools' JSON "
            "schemas (the run ends at complete_task, which carries the answer, so any task "
            "fits); a small model's free-text turns are mostly malformed calls. 'auto': the "
            "model may also answer in text."
        ),
    )
    final_answer_turn: bool = Field(
        True,
        description=(
            "The last of max_turns may only call complete_task, so a rollout that runs out of "
            "turns still ends with an answer (LangChain's early_stopping_method='generate'); "
            "the untrained SmolLM2-135M often repeats a lookup until it runs out of turns. "
            "False: a rollout out of turns ends without an answer."
        ),
    )
    after_repeat: Literal["allow", "answer", "switch"] = Field(
        "switch",
        description=(
            "What the turn after one whose tool calls all repeat earlier calls of the rollout "
            "(name and arguments) may call: allow: any tool; answer: only complete_task (what "
            "it looked up it has); switch: any tool but the repeated ones (another lookup, or "
            "the answer; the prompt still shows every tool, OpenAI's allowed_tools, so its "
            "prefix stays cached), so an agent stuck re-making one call moves on, and a task of "
            "several different lookups keeps its turns (the sweep's choice, with 6 turns). "
            "Assumes "
            "repeating a call returns what it did: a polling tool wants allow."
        ),
    )
    repeat_penalty: float = Field(
        0.1,
        ge=0,
        description=(
            "Subtracted from the reward of a training rollout that solved its task (reward at "
            "or above success_reward) for each tool call that repeats an earlier call of the "
            "rollout (name and arguments; complete_task aside), after the reward function or "
            "judge scored it: GRPO then ranks a solution without repeats above one with them, "
            "and a group whose rollouts all solved it, some with repeats, carries a signal. "
            "Failed rollouts keep their reward (a group's rewards are scaled by their spread, "
            "so a penalty among failures alone would teach giving up before a second try). "
            "In the reward's "
            "units: 0.1 is a tenth of a 0-1 reward. The score is kept as the trajectory's "
            "metadata['task_reward'], which counts success in the reports; held-out "
            "evaluations score without it. Assumes repeating a call returns what it did (as "
            "after_repeat): a polling tool wants 0. Chosen by a sweep of 0 and 0.1 on three "
            "task shapes' validation slices, 2 seeds each (bench/results/repeat_penalty): "
            "sampled rise +0.61 against +0.30 on the staff directory, +0.08 against +0.05 on "
            "the org chart, +0.03 against +0.04 on capitals (which the warm start solves); "
            "repeated calls per solved episode after RL 0.01 against 0.17 and 0.03."
        ),
    )
    repeated_calls: Literal["episode", "at_most_zero"] = Field(
        "episode",
        description=(
            "The advantage of an RL turn whose tool calls all repeat earlier calls of the "
            "rollout (`TrainConfig.repeated_calls`): episode, the rollout's; at_most_zero, "
            "the rollout's where negative, else 0, so a solved rollout does not reinforce "
            "the lookups it made again (under after_repeat switch a repeat also forces the "
            "next turn onto another tool, which RL can learn to use: on the two-hop task's "
            "held-out seed 5 of d282237, repeated calls per solved episode rose 0.74 -> "
            "1.86). Not swept yet: episode, as GRPO trains."
        ),
    )
    eval_samples: int = Field(
        2,
        ge=0,
        description=(
            "Held-out evaluation: besides one greedy episode per scenario, this many sampled "
            "at temperature 1 (success is then the mean over scenarios of the solved share)."
        ),
    )
    eval_scenarios: int | None = Field(
        24,
        ge=1,
        description=(
            "Evaluate on this many held-out scenarios, a fixed sample drawn with --seed (the "
            "same one before and after training, and after a restart); None: all of them. "
            "An evaluation runs (1 + eval_samples) episodes per scenario: 24 x 3 took 2-3 min "
            "for SmolLM2-135M on 2 AVX2 CPU cores, and gave the paired rise in sampled success "
            "a standard error of 0.07-0.09 over 5 seeds (docs/results.md)."
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
    learning_rate: float | None = Field(
        None,
        gt=0,
        description=(
            "GRPO learning rate of the LoRA adapter; None: from the model's width "
            "(`default_learning_rate`): SWEPT_LEARNING_RATE, chosen by bench.defaults_sweep on "
            "SmolLM2-135M (hidden size 576), times sqrt(576 / hidden size) for other models "
            "(an extrapolation not measured beyond 135M); 5e-4 for the tiny preset."
        ),
    )
    loss_normalization: Literal["token_mean", "sequence_mean"] = Field(
        "token_mean",
        description=(
            "How an RL step's loss is averaged (`TrainConfig.loss_normalization`): token_mean "
            "over every trained token (DAPO; a long episode weighs more), sequence_mean "
            "within each sequence, then over the sequences (the GRPO paper; each episode "
            "weighs the same)."
        ),
    )
    signal_share_scale: bool = Field(
        False,
        description=(
            "Scale each RL step's loss by the share of its rollouts whose group carries a "
            "signal (`TrainConfig.signal_share_scale`): a step where most groups got one "
            "reward for every rollout moves the adapter less. With shuffle_rewards the share is "
            "the shuffled step's (nearly every group differs), so a control's updates stay "
            "full-size: compare it with a control run without this."
        ),
    )
    flat_groups: Literal["skip", "batch_baseline", "batch_baseline_positive"] = Field(
        "skip",
        description=(
            "What an RL step trains on a group whose rollouts all got one reward "
            "(`TrainConfig.flat_groups`): skip (nothing, GRPO) or batch_baseline (their "
            "rewards against the step's mean, so after a warm start a question type the "
            "policy already solves keeps being reinforced while other groups train), or "
            "batch_baseline_positive (only the flat groups above the step's mean)."
        ),
    )
    stop_when_flat: int = Field(
        2,
        ge=0,
        description=(
            "End RL after this many steps in a row that trained on nothing (every group, "
            "refills included, gave all its rollouts one reward: the adapter is unchanged and "
            "the next step samples the same policy), then evaluate; the log and the report say "
            "so, and a restart keeps it. 0: every step runs. Replayed over the 114 runs on "
            "record (bench/results/flat_stop), 2 ended none of them and 1 would have ended 3 "
            "that found signal later; on the capitals task after the warm start 5 of 6 steps "
            "were flat (docs/benchmarks.md#time-to-rise)."
        ),
    )
    eval_untrained: bool = Field(
        True,
        description=(
            "Evaluate the untrained model on the held-out scenarios first (the report's "
            "untrained row, the warm start's own rise, the run's first time estimate). False "
            "skips it, when its figures are known already (a sweep's arms share them): the "
            "report then starts at the evaluation before RL, and RL's rise is from there."
        ),
    )
    eval_every: int = Field(
        0,
        ge=0,
        description=(
            "Also evaluate on the held-out scenarios every this many steps; 0: only before RL "
            "and after the last step. An evaluation is skipped when no step since the last one "
            "trained on anything (the adapter is the one evaluated)."
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
    sft_epochs: int | None = Field(
        None,
        ge=0,
        description=(
            "Epochs of an SFT warm start on demonstrations (the training scenarios' own, or "
            "--sft) before RL; None: 3 when there are demonstrations, else none; 0: RL alone. "
            "On the two-hop task's validation slice one epoch taught the calls' shape but not "
            "which field or tool a question wants (one-hop success fell to 0.05, every lookup "
            "asked for the same field); three took one-hop and two-hop sampled success to "
            "0.58 and 0.57 (bench/results/warm_start). The report gives the warm start's rise "
            "apart from RL's, and RL's from the evaluation after the warm start."
        ),
    )
    sft_learning_rate: float = Field(
        3e-3,
        gt=0,
        description=(
            "Learning rate of the SFT warm start: on the two-hop task's validation slice, one "
            "epoch at 3e-3 took two-hop sampled success from 0.00 to 0.28, at 1e-3 to 0.17 "
            "(bench/results/warm_start)."
        ),
    )
    sft_compute_dtype: Literal["auto", "model", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "Dtype of the SFT warm start's matmuls (`TrainConfig.sft_compute_dtype`): model: "
            "the trainer's (`compute_dtype`, which RL steps keep); auto: bfloat16 where the "
            "device multiplies it in hardware (CUDA, AMX, AVX-512-BF16), else the model's; "
            "float32 or bfloat16: that. auto, since a capitals run on 2 AMX cores took "
            "0.46x the issue-55 reference's wall time against float32's 0.55x, under 4 GiB, "
            "and four org-chart seeds learnt no less (docs/benchmarks.md"
            "#time-to-rise-bf16-default)."
        ),
    )
    sft_frozen_root: bool = Field(
        False,
        description=(
            "Train the SFT warm start's demonstrations without gradient through the system "
            "prompt and tool specs they share (`TrainConfig.sft_frozen_root`): 0.69x an SFT "
            "step, and on capitals a run 0.53x the wall time against 0.69x, but on the org "
            "chart's validation slice three such epochs left held-out greedy success at 0.52 "
            "and 0.77 against 0.83 and 0.88 (two seeds), so it is off "
            "(docs/benchmarks.md#frozen-root)."
        ),
    )
    sft_stop_loss: float | None = Field(
        0.005,
        ge=0,
        description=(
            "Without a probe (`sft_probe`: given demonstrations, or too few): end the SFT "
            "warm start before `sft_epochs` once an epoch from the second on "
            "has a last quarter of batches with a mean token loss (nats) at or under this. "
            "None: every epoch runs. The log gives each epoch's tail loss, its share of "
            "demonstrations with no token in doubt, and the warm start's time. On the "
            "validation slices (bench/results/warm_stop), capitals' epochs ended at 0.016, "
            "0.003, 0.013 (held-out sampled success 0.60, 1.00, 0.98 after 1, 2, 3 epochs) and "
            "the two-hop org chart's at 0.089, 0.040, 0.004 (0.18, 0.31, 0.70): 0.005 stops "
            "capitals after two and the org chart after three (with the LoRA seeded, on "
            "another host, capitals' second epoch ended at 0.006 and 0.003 on seeds 1 and 2: "
            "seed 1 would run a third). The first epoch never stops "
            "it (`training.sft.FIRST_STOP_EPOCH`): with capitals' 128 demonstrations its tail "
            "fell to 0.004 in three paired runs that then held 0.58-0.67 before RL and ended "
            "below the reference (docs/benchmarks.md#time-to-rise)."
        ),
    )
    sft_probe: int = Field(
        8,
        ge=0,
        description=(
            "Training scenarios held back from a warm start on the scenarios' own "
            "demonstrations (whole entities: `metadata['entity']`, else the scenario; at most "
            "one demonstration in 16, none below 4) and run greedily after each epoch but the "
            "last: the warm start ends once `sft_probe_pass` of them succeed "
            "(art_mcp/warm_start.py). They stay in RL's training set. 0, or a run without a "
            "reward function (the probe reads its score): no probe, `sft_stop_loss` decides. On capitals a token loss of 0.00 after two epochs hid "
            "a seed whose agent called one tool for every question (held-out 0.46 greedy; a "
            "third epoch took it to 1.00: docs/benchmarks.md#time-to-rise)."
        ),
    )
    sft_replay: int = Field(
        0,
        ge=0,
        description=(
            "Demonstrations replayed after each RL step: one SFT step, at RL's learning rate, "
            "on this many of the warm start's demonstrations (drawn by the seed and the "
            "step), so that a question type the warm start solved, whose groups have one "
            "reward and train nothing, keeps a gradient while RL's other groups move the "
            "policy (InstructGPT's PPO-ptx, as a step of its own). 0 (the default): off, as 8 "
            "did not keep the two-hop task's one-hop questions on held-out seed 7 (-0.36) and "
            "split its validation seeds (docs/benchmarks.md#rl-update-size). Nothing without "
            "demonstrations (art_mcp/warm_start.py)."
        ),
    )
    sft_probe_pass: float = Field(
        0.85,
        gt=0,
        le=1,
        description=(
            "The share of the probe's scenarios that must succeed to end the warm start. "
            "Held-out greedy success after 1, 2 and 3 epochs, on record "
            "(bench/results/warm_stop, bench/results/misc/warm_start_seed3_capitals_avx2.json): "
            "capitals 0.67, then 0.46-1.00 (four seeds), then 1.00; the two-hop org chart "
            "0.21, 0.50, then 0.81-0.88. 0.85 would end capitals after the second epoch where "
            "it had learnt the task and lets the rest run on (docs/benchmarks.md#warm-probe)."
        ),
    )
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "The trainer's matmul dtype (ModelConfig.compute_dtype); auto: the engine's "
            "weights dtype (the sampler's precision). bfloat16 over float32 weights halves a "
            "real model's step time and activation memory on CPUs that multiply bfloat16 in "
            "hardware (AMX, AVX-512-BF16), at a larger sampler/trainer logprob mismatch (0.02 "
            "mean, 0.3 max on SmolLM2, against 1e-5 in float32)."
        ),
    )
    engine_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "The inference engine's weights and KV-cache dtype (TorchEngineConfig.dtype); auto: "
            "bfloat16 on CUDA; on CPUs that multiply it in hardware (AMX, AVX-512-BF16), "
            "float32 for a model of at most 270M parameters (SmolLM2-135M learned more in "
            "float32 there, at 1.2-1.8x the wall time) and bfloat16 above; float32 on other "
            "CPUs, where bfloat16 is emulated and several times slower. Set "
            "one dtype by hand, set the other alike, so sampler and trainer round alike."
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
    seed: int = Field(
        0,
        description=(
            "Seed for the split, the step order and the LoRA initialisation. Before the "
            "initialisation took it, a task whose scenarios carry their own split (every "
            "bundled one) got the same warm start on every seed: seeds varied only sampling."
        ),
    )
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
            "of every RL step's rollouts for human review (integrations/langfuse/annotation.py: a seeded "
            "--review-fraction, the judge-vs-reward disagreements, the borderline ones); "
            "the report then gives the judge's agreement with the reviews. None: no review."
        ),
    )
    review_fraction: float = Field(
        0.1, ge=0, le=1, description="Share of each step's rollouts sent to --review-queue."
    )

    def lr(self) -> float:
        """The learning rate this run trains with: `learning_rate`, else the model's default."""
        return self.learning_rate or default_learning_rate(self.base_model)[0]

    def rl_config(self) -> TrainConfig:
        """The `TrainConfig` of this run's RL steps."""
        return TrainConfig(
            learning_rate=self.lr(),
            micro_batch_tokens=self.micro_batch_tokens,
            signal_share_scale=self.signal_share_scale,
            loss_normalization=self.loss_normalization,
            flat_groups=self.flat_groups,
            repeated_calls=self.repeated_calls,
        )

    def warm_start_epochs(self, demonstrations: int) -> int:
        """The SFT warm start's epochs given how many demonstrations there are: `sft_epochs`
        when set, else `DEFAULT_SFT_EPOCHS` with demonstrations and none without."""
        if not demonstrations:
            return 0
        return DEFAULT_SFT_EPOCHS if self.sft_epochs is None else self.sft_epochs

    @field_validator("allow_tools", "deny_tools", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [n.strip() for n in value.split(",") if n.strip()]
        return value
