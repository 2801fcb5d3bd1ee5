"""Held-out evaluation records for `art_mcp.train`: greedy and sampled, paired per scenario.

An `Evaluation` is one pass over the held-out scenarios at one checkpoint: one greedy
episode (temperature 0) and `samples` episodes at temperature 1 per scenario. It keeps
every episode's reward by scenario id, so two evaluations compare *paired*, scenario by
scenario (`paired_rise`), a short transcript of each greedy episode, so a report can
show what changed in the agent's behaviour (`changed_examples`), and each episode's count
of server calls and repeated calls, so it can say whether the agent solves with fewer
(`Evaluation.calls_per_solved`).

Success is a reward at or above `success_reward` (a fully correct episode); *format* is
the share of episodes whose first tool call named the right tool (the scenario's
`metadata["tool"]`, else any tool but `complete_task`) and ran without error — reported
apart from correctness, because a small model's early gains are mostly format.

Which scenarios an evaluation runs: all held-out ones, or a fixed seeded sample of them
(`eval_sample`), the same before and after training. Its sampled episodes draw their
tokens from fixed seeds too (`eval_draws`: the run's seed, the scenario and the sample's
index, each model call its own), the same at every evaluation of the run: common random
numbers, so a paired rise compares two policies on the same draws, where a policy that
did not change scores the same, and a model evaluated twice (the same warm start in an
RL run and its control) gets the same figures. Without them one warm-started model
measured 0.50 and 0.79 sampled on the two-hop task's held-out two-hop slice in two runs
(docs/results.md). With Langfuse configured, each
evaluation is also a Langfuse dataset run (`log_to_langfuse`).

Left out: running the episodes (harness.py); confidence intervals beyond the paired
standard error.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import art_langgraph as art
from art_langgraph.runtime.names import inference_name
from art_mcp.config import HarnessConfig
from art_mcp.scenarios import Scenario
from art_mcp.scoring import repeated_calls, task_reward


class EpisodeCalls(BaseModel):
    """What one held-out episode called, `complete_task` aside."""

    calls: int
    """Tool calls to the server."""
    repeated: int
    """Of those, calls that repeat an earlier one of the episode, name and arguments alike."""
    solved: bool
    """Whether the episode's reward reached the success reward."""


def episode_calls(traj: art.Trajectory, success_reward: float) -> EpisodeCalls:
    """The episode's server calls and repeats (`EpisodeCalls`)."""
    calls = sum(ev.name != "complete_task" for ev in traj.tool_events)
    solved = task_reward(traj) >= success_reward
    return EpisodeCalls(calls=calls, repeated=repeated_calls(traj), solved=solved)


class Evaluation(BaseModel):
    """One held-out evaluation at one checkpoint."""

    step: int
    """The checkpoint's step (0: the untrained model)."""
    rl_step: int
    """GRPO steps done before it (0: before RL)."""
    greedy: dict[str, float] = Field(default_factory=dict)
    """Scenario id -> the greedy episode's reward."""
    sampled: dict[str, list[float]] = Field(default_factory=dict)
    """Scenario id -> the rewards of its sampled episodes (temperature 1)."""
    greedy_format: dict[str, bool] = Field(default_factory=dict)
    """Scenario id -> whether the greedy episode's first call was the right tool, without error."""
    sampled_format: float | None = None
    """Share of sampled episodes whose first call was the right tool, without error; None
    without samples (None, not NaN: report.json writes NaN as null, which must load back)."""
    transcripts: dict[str, str] = Field(default_factory=dict)
    """Scenario id -> the greedy episode in one line (calls, results, answer)."""
    success_reward: float = 1.0
    """The reward at or above which an episode counts as solved."""
    calls: dict[str, list[EpisodeCalls]] = Field(default_factory=dict)
    """Scenario id -> each of its episodes' calls, greedy and sampled alike; empty
    in evaluations saved before it was recorded."""

    def _mean(self, values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    @property
    def greedy_reward(self) -> float:
        return self._mean(list(self.greedy.values()))

    @property
    def greedy_success(self) -> float:
        return self._mean([float(r >= self.success_reward) for r in self.greedy.values()])

    @property
    def sampled_reward(self) -> float:
        return self._mean([r for rs in self.sampled.values() for r in rs])

    @property
    def sampled_success(self) -> float:
        """The mean over scenarios of each scenario's share of solved samples."""
        return self._mean([self._success_share(rs) for rs in self.sampled.values() if rs])

    @property
    def greedy_format_rate(self) -> float:
        return self._mean([float(ok) for ok in self.greedy_format.values()])

    def _success_share(self, rewards: list[float]) -> float:
        return sum(r >= self.success_reward for r in rewards) / len(rewards)

    def summary(self) -> dict[str, float]:
        """The headline figures, for rows and logs."""
        return {
            "greedy_success": self.greedy_success,
            "sampled_success": self.sampled_success,
            "greedy_reward": self.greedy_reward,
            "sampled_reward": self.sampled_reward,
            "greedy_format": self.greedy_format_rate,
            "sampled_format": float("nan") if self.sampled_format is None else self.sampled_format,
        }

    def calls_per_solved(self, ids: Collection[str] | None = None) -> dict[str, float]:
        """Over the solved episodes, greedy and sampled (of the scenarios `ids`, when
        given): {"calls": mean server calls, "repeated": mean repeated calls, "solved":
        how many}; NaN means where none was solved or no calls were recorded."""
        done = [
            c for k, eps in self.calls.items() if ids is None or k in ids for c in eps if c.solved
        ]
        n = len(done)
        return {
            "calls": sum(c.calls for c in done) / n if n else float("nan"),
            "repeated": sum(c.repeated for c in done) / n if n else float("nan"),
            "solved": float(n),
        }

    def per_scenario_success(self, kind: str) -> dict[str, float]:
        """Scenario id -> success (greedy: 0 or 1; sampled: the share of solved samples)."""
        if kind == "greedy":
            return {k: float(r >= self.success_reward) for k, r in self.greedy.items()}
        return {k: self._success_share(rs) for k, rs in self.sampled.items() if rs}


def paired_rise(
    before: Evaluation,
    after: Evaluation,
    kind: str = "sampled",
    clusters: Mapping[str, str] | None = None,
    ids: Collection[str] | None = None,
) -> dict[str, float]:
    """Mean per-scenario change in success from `before` to `after` over the scenarios
    both saw (of `ids` only, when given), with its standard error and the mean success
    before and after over the same scenarios; `kind` is "sampled" or "greedy". `clusters`
    (scenario id -> its entity, `entity_clusters`): the error is clustered by entity, since
    phrasings of one entity's question succeed or fail together; with every scenario its
    own cluster it equals the plain paired error."""
    a, b = before.per_scenario_success(kind), after.per_scenario_success(kind)
    keys = [k for k in a if k in b and (ids is None or k in ids)]
    diffs = [b[k] - a[k] for k in keys]
    n = len(diffs)
    if n == 0:
        return {"rise": float("nan"), "se": float("nan"), "n": 0.0}
    mean = sum(diffs) / n
    levels = {"before": sum(a[k] for k in keys) / n, "after": sum(b[k] for k in keys) / n}
    if clusters is None:
        var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else float("nan")
        se = math.sqrt(var / n) if n > 1 else float("nan")
        return {"rise": mean, "se": se, "n": float(n), **levels}
    sums: dict[str, float] = {}
    for k, d in zip(keys, diffs, strict=True):
        c = clusters.get(k, k)
        sums[c] = sums.get(c, 0.0) + d - mean
    g = len(sums)
    se = math.sqrt(g / (g - 1) * sum(x * x for x in sums.values())) / n if g > 1 else float("nan")
    return {"rise": mean, "se": se, "n": float(n), "clusters": float(g), **levels}


def slices(scenarios: list[Scenario]) -> dict[str, set[str]]:
    """`metadata["slice"]` label (e.g. "wording unseen", "two-hop") -> the ids of the
    scenarios carrying it; empty when no scenario has one."""
    out: dict[str, set[str]] = {}
    for s in scenarios:
        label = s.metadata.get("slice")
        if label:
            out.setdefault(str(label), set()).add(s.id)
    return out


def entity_clusters(scenarios: list[Scenario]) -> dict[str, str] | None:
    """Scenario id -> `metadata["entity"]` (the person, country or book a question is
    about), or None when no scenario names one."""
    named = {s.id: str(s.metadata["entity"]) for s in scenarios if s.metadata.get("entity")}
    return named or None


def _first_call(traj: art.Trajectory) -> art.ToolEvent | None:
    return next(iter(traj.tool_events), None)


def episode_format(traj: art.Trajectory, scenario: Scenario) -> bool:
    """Whether the episode's first tool call named the right tool and ran without error."""
    ev = _first_call(traj)
    if ev is None or ev.error is not None:
        return False
    want = scenario.metadata.get("tool")
    return ev.name == want if want else ev.name != "complete_task"


def transcript(traj: art.Trajectory, limit: int = 400) -> str:
    """The episode in one line: each call with its arguments and result, or what the
    model said when it made no call."""
    parts = []
    for ev in traj.tool_events:
        args = ev.args if isinstance(ev.args, str) else json.dumps(ev.args, ensure_ascii=False)
        out = (
            f"error: {ev.error}"
            if ev.error is not None
            else json.dumps(ev.result, ensure_ascii=False)
        )
        parts.append(f"{ev.name}({args}) -> {out}")
    if not parts:
        said = next(
            (
                str(m.get("content"))
                for m in reversed(traj.messages)
                if m.get("role") == "assistant"
            ),
            "",
        )
        parts.append(f"no tool call; said {said!r}")
    text = " | ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def changed_examples(
    before: Evaluation,
    after: Evaluation,
    scenarios: list[Scenario],
    k: int = 3,
    only: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Up to `k` held-out scenarios (of `only`, when given) whose greedy episode failed
    before and succeeded after (else any whose reward changed), with both transcripts."""
    tasks = {s.id: s.task for s in scenarios}
    labels = {s.id: str(s.metadata.get("slice") or "") for s in scenarios}
    ids = [i for i in before.greedy if i in after.greedy and (only is None or i in only)]
    fixed = [i for i in ids if before.greedy[i] < before.success_reward <= after.greedy[i]]
    changed = [i for i in ids if i not in fixed and before.greedy[i] != after.greedy[i]]
    out = []
    for i in (fixed + changed)[:k]:
        out.append(
            {
                "scenario": i,
                "task": tasks.get(i, ""),
                "slice": labels.get(i, ""),
                "before": before.transcripts.get(i, ""),
                "before_reward": before.greedy[i],
                "after": after.transcripts.get(i, ""),
                "after_reward": after.greedy[i],
            }
        )
    return out


EVAL_DRAWS = 0x65766C
"""The path tag of evaluation draws under the run's seed (`art.derive_seed`), apart from
any other seeded sampling of the run."""


def eval_draws(seed: int, jobs: Sequence[tuple[Scenario, bool]]) -> list[int]:
    """Each evaluation episode's sampling seed, for `jobs` of (scenario, greedy): the k-th
    episode of a scenario in `jobs` draws from `art.derive_seed(seed, EVAL_DRAWS, <the
    scenario id's hash>, k)`, so the same scenario's k-th episode draws alike at every
    evaluation of a run of `seed`, whatever else the evaluation holds."""
    seen: dict[str, int] = {}
    out = []
    for s, _ in jobs:
        k = seen[s.id] = seen.get(s.id, -1) + 1
        digest = hashlib.blake2b(s.id.encode(), digest_size=8).digest()
        out.append(art.derive_seed(seed, EVAL_DRAWS, int.from_bytes(digest, "big"), k))
    return out


def eval_sample(val_set: list[Scenario], n: int | None, seed: int) -> list[Scenario]:
    """The held-out scenarios an evaluation runs: all, or a fixed sample of `n` drawn with
    `seed` (in their original order), so every evaluation of a run pairs the same ones."""
    if n is None or n >= len(val_set):
        return val_set
    keep = set(random.Random(f"{seed}/eval").sample(range(len(val_set)), n))
    return [s for i, s in enumerate(val_set) if i in keep]


def _langfuse_on() -> bool:
    env = os.environ.get
    return env("ART_LANGFUSE", "1") != "0" and bool(
        env("LANGFUSE_PUBLIC_KEY") and env("LANGFUSE_SECRET_KEY")
    )


def held_out_dataset(name: str, cfg: HarnessConfig) -> str:
    """The Langfuse dataset the held-out evaluations of model `name` go to."""
    return f"{cfg.project}-{name}-held-out"


async def check_langfuse_dataset(name: str, cfg: HarnessConfig) -> None:
    """Before any rollout, when Langfuse is configured: raise `DatasetClashError` if the
    held-out dataset's name is taken by a dataset that is not ours."""
    if not _langfuse_on():
        return
    try:
        from art_langgraph.integrations.langfuse.datasets import check_dataset
    except ImportError:
        return
    await asyncio.to_thread(check_dataset, held_out_dataset(name, cfg))


def evaluation_label(step: int, rl_step: int) -> str:
    """How the run's lines name the evaluation of the model's `step`: by RL step, as every
    other line is (the model's own step also counts an SFT warm start's)."""
    if step == 0:
        return "the untrained model's held-out evaluation"
    if rl_step == 0:
        return "held-out evaluation after the SFT warm start, before RL"
    return f"held-out evaluation after RL step {rl_step}"


async def log_to_langfuse(
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
    `{project}-{name}-held-out` (art_langgraph/integrations/langfuse/datasets.py). Fail-soft;
    a dataset or score-config name clash stops the run with its error."""
    if not _langfuse_on():
        return
    try:
        from art_langgraph.integrations.langfuse.datasets import log_evaluation
    except ImportError:
        return  # the backend's logger already said the extra is missing
    res = await asyncio.to_thread(
        log_evaluation,
        dataset=held_out_dataset(name, cfg),
        run_name=inference_name(name, step),
        items=[(s, t) for (s, _), t in zip(jobs, trajs, strict=True)],
        success_reward=cfg.success_reward,
        metadata={"model": name, "step": step, "rl_step": rl_step},
        folder=folder,
    )
    if res.sent:
        log(f"Langfuse: {evaluation_label(step, rl_step)} is dataset run {name}@{step}")
