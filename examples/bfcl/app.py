"""Train a LangGraph function-calling app on BFCL with GRPO, scored by BFCL's own checker.

    ./scripts/setup-bfcl.sh                 # once: BFCL's environment, apart from ours
    python -m examples.bfcl [--steps 6] [--seed 0] [--control] [--out runs/bfcl]

This is the code a user with a LangGraph agent writes; nothing in it is a harness of ours:

1. The app: a one-node LangGraph graph per BFCL item, whose model is `model.chat_model()`
   with the item's functions bound as tools (`bind_tools`, the tools as BFCL's own
   `convert_to_tool` writes them for OpenAI models). `tool_choice="required"`: the
   untrained SmolLM2-135M answers in prose under "auto" (issue 53's probe: 0 of 120
   calling items made a call), so the graph asks for calls, and the model learns which
   functions, how many, and which arguments. A graph that forces a call must still let
   the model decline: it binds one more tool, `decline`, whose call counts as no call, so
   an irrelevance item passes when the model calls only `decline` (BFCL: no call).
   Irrelevance is reported under "required" and also greedy under "auto", apart from the
   rise.
2. Rollouts: `art.rollouts(graph, input, group_size, reward=...)` per training item,
   8 items a step, drawn in turn from simple_python, multiple and irrelevance (`TRAINED`,
   chosen on the validation slice: the parallel categories' groups pulled the model's
   call count against what the one-call categories need), 4 runs each at temperature 1:
   the MCP harness's defaults (art_mcp/config.py). Each group is seeded from `--seed`
   (`art.rollouts(..., seed=)`), as is each sampled evaluation item (the same draws
   before and after): a seed replays its run, as far as the engine's logits repeat.
3. The reward: 1.0 when BFCL's `ast_checker` passes the calls; otherwise partial credit in
   [0, 0.5] for the right functions, parameter names and values, decomposed as ToolRL does
   (`partial_credit`). Every figure reported is BFCL's pass/fail alone.
4. Training: `model.train(groups)` with `TrainConfig`'s defaults (the learning-rate rule,
   the loss): the library's defaults, unchanged for this app (`--train-config` changes
   them for a sweep's arm).
5. Evaluation, before and after, on a fixed sample of the held-out half (40 items a
   category; splits.py: no held-out function occurs in training): BFCL accuracy greedy
   (as BFCL evaluates) and sampled at T=1, per category, with the paired standard error.
   `--control` shuffles each step's rewards (the honest baseline for "learning").

Writes `result.json` (per-category accuracies, wall time of each phase, peak RSS, the
commit and the arguments) into `--out`. Left out: the live, multi-turn, memory, web-search
and format-sensitivity categories (a transfer test nobody here may tune on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from langgraph.graph import START, MessagesState, StateGraph

import art_langgraph as art
from art_langgraph.runtime.allocator import allocator_in_use
from art_langgraph.runtime.devices import matmul_flags
from art_langgraph.utils import atomic_write
from examples.bfcl.answers import (
    DECLINE_TOOL,
    REPEAT_DECLINE_REWARD,
    calls_of,
    declines_of,
    partial_credit,
)
from examples.bfcl.checker import BfclChecker
from examples.bfcl.record import PhasePeaks, code_hash, commit_stamp
from examples.bfcl.splits import load_splits

CALLING = ("simple_python", "multiple", "parallel", "parallel_multiple")
"""The categories whose items ask for calls: the mean of them is the rise."""
TRAINABLE = (*CALLING, "irrelevance")
"""The categories a run may train on (`--train-categories`, their training halves) and
evaluate (`--eval-categories`, their held-out sample or validation slice)."""
TRAINED = ("simple_python", "multiple", "irrelevance")
"""The categories a step draws its items from, in turn (the default `--train-categories`):
the calling categories that ask for one call, and irrelevance (whose items pass only when
the model declines), 1 group in 3 each. Chosen on the training half's validation slice
against the earlier mix, which also drew parallel and parallel_multiple (2 groups in 6
irrelevance; `bench.bfcl_mix`'s `third` and `noparallel` arms, docs/bfcl.md): no run has
moved the parallel categories, and their groups, which reward several calls, pulled the
untrained model's call count the other way from the one-call items'."""
MAX_TOKENS = 192
"""The most tokens an answer may take. Every simple_python and multiple item's shortest
right answer fits (at most 113 tokens on the train half), but only 88% of parallel's and
68% of parallel_multiple's training items fit (88% of each held-out sample); 256 would
fit 99-100% of both (`bench.probes.bfcl_answer_tokens`, docs/bfcl.md#answer-length).
Not raised: every run so far, and the CI arm's margin, used 192, and a larger budget
lengthens the untrained model's repeated calls, which run to the limit."""


# ------------------------------------------------------------------ the user's app
def build_graph(
    chat: Any, tools: list[dict[str, Any]], tool_choice: str = "required", seed: int | None = None
) -> Any:
    """The app: one node that asks the model, with the item's functions as its tools, and
    `decline` for a request they cannot serve (the graph forces a call). `seed`: the
    request's sampling seed (OpenAI's `seed`), for an evaluation that samples."""
    extra = {"seed": seed} if seed is not None else {}
    bound = chat.bind_tools([*tools, DECLINE_TOOL], tool_choice=tool_choice, **extra)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    return graph.compile()


# ------------------------------------------------------------------ the run
class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.checker = BfclChecker()
        self.splits = load_splits()
        self.items = {it["id"]: it for c in TRAINABLE for it in self.checker.items(c)}

    async def verdict(self, item: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        """BFCL's verdict on the graph's answer: `valid`, and where it fails, BFCL's
        `error_type` (`simple_function_checker:wrong_count`, ...)."""
        result: dict[str, Any] = await asyncio.to_thread(self.checker.check, item, calls_of(output))
        return result

    async def answer(
        self, item: dict[str, Any], chat: Any, choice: str, seed: int | None = None
    ) -> dict[str, Any] | str:
        """BFCL's verdict on the graph's answer to `item`, or the error when the request to
        the model failed: an evaluation counts that item failed and goes on (`Tally`)."""
        try:
            out = await build_graph(chat, item["tools"], choice, seed).ainvoke(
                {"messages": item["question"][0]}
            )
        except (openai.APIError, httpx.HTTPError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return await self.verdict(item, out)

    async def reward(
        self, item: dict[str, Any], output: dict[str, Any], traj: art.Trajectory | None = None
    ) -> float:
        """1.0 on BFCL's pass, else half the partial credit; `traj`, where given, gets the
        rollout's call count and BFCL verdict among its metrics (for the step's diagnostics).
        BFCL passes any number of `decline` calls, and at full reward an irrelevance group
        teaches the repeated calls the calling items fail on (`wrong_count`): with
        `--decline-reward once` a pass by declining n times earns 1/n, as a wrong number of
        calls scales partial credit; with `tiebreak`, REPEAT_DECLINE_REWARD, which ranks one
        decline above several within a group without bringing several near a wrong call."""
        passed = bool((await self.verdict(item, output))["valid"])
        calls = calls_of(output)
        declines = declines_of(output)
        if traj is not None:
            traj.metrics.update(calls=len(calls), bfcl_pass=passed, declines=declines)
        if not passed:
            return 0.5 * partial_credit(item, calls)
        if declines <= 1 or self.args.decline_reward == "any":
            return 1.0
        return 1.0 / declines if self.args.decline_reward == "once" else REPEAT_DECLINE_REWARD

    async def evaluate(self, model: art.TrainableModel, label: str) -> dict[str, Any]:
        """BFCL pass rates on the evaluation sample: greedy and one sample at T=1 per item
        under "required", and irrelevance also greedy under "auto"."""
        greedy = model.chat_model(temperature=0, max_tokens=MAX_TOKENS)
        sampled = model.chat_model(temperature=1.0, max_tokens=MAX_TOKENS)
        limit_items = self.args.eval_limit
        source = "eval_sample" if self.args.eval_split == "heldout" else "validation"
        sample = {c: ids[:limit_items] for c, ids in self.splits[source].items()}
        limit = asyncio.Semaphore(32)

        async def one(
            item_id: str, chat: Any, choice: str, seed: int | None
        ) -> dict[str, Any] | str:
            async with limit:
                return await self.answer(self.items[item_id], chat, choice, seed)

        jobs: list[tuple[str, str, Any]] = []
        categories = self.args.eval_categories.split(",")
        modes = {"greedy": greedy, "sampled": sampled}
        for n, (c, i) in enumerate((cat, i) for cat in categories for i in sample[cat]):
            seed = art.derive_seed(self.args.seed, 1, n)  # alike before and after
            for mode in self.args.eval_modes.split(","):
                jobs.append((f"{c}/{mode}", i, one(i, modes[mode], "required", seed)))
        if "irrelevance" in categories:
            for i in sample["irrelevance"]:
                jobs.append(("irrelevance/greedy_auto", i, one(i, greedy, "auto", None)))
        start = time.monotonic()
        answers = await asyncio.gather(*(j[2] for j in jobs))
        tally = Tally()
        for (key, item_id, _), answer in zip(jobs, answers, strict=True):
            tally.add(key, item_id, answer)
        seconds = time.monotonic() - start
        print(f"{label}: {_summary(tally.per_item)}{tally.note()} ({seconds:.0f} s)")
        tally.check(label)
        return {
            "per_item": tally.per_item,
            "errors": tally.errors,
            "error_types": tally.error_types,
            "seconds": round(seconds, 1),
        }

    async def step_groups(
        self, model: art.TrainableModel, rng: random.Random, step: int = 0
    ) -> list[Any]:
        """One group per training item; the step's items come from TRAINED's categories
        in turn (the turn continuing across steps), each drawn at random from its train half."""
        chat = model.chat_model(temperature=self.args.temperature, max_tokens=MAX_TOKENS)
        trained = tuple(self.args.train_categories.split(","))
        categories = step_categories(step, self.args.groups_per_step, trained)
        batch = [
            self.items[i]
            for c in dict.fromkeys(trained)  # a category named twice gets twice the share
            for i in rng.sample(self.splits["train"][c], categories.count(c))
        ]

        def reward_for(item: dict[str, Any]) -> Any:
            async def reward(traj: art.Trajectory, output: Any) -> float:
                return await self.reward(item, output, traj)

            return reward

        return list(
            await asyncio.gather(
                *(
                    art.rollouts(
                        build_graph(chat, item["tools"]),
                        {"messages": item["question"][0]},
                        self.args.group_size,
                        reward=reward_for(item),
                        metadata={"bfcl_id": item["id"]},
                        seed=art.derive_seed(self.args.seed, 0, step, k),  # the run's draws
                    )
                    for k, item in enumerate(batch)
                )
            )
        )


def step_categories(step: int, groups: int, trained: tuple[str, ...] = TRAINED) -> list[str]:
    """The categories of step `step`'s `groups` items: `trained`'s in turn, continued from
    the step before, so every category gets as many groups as the steps allow."""
    return [trained[(step * groups + k) % len(trained)] for k in range(groups)]


def rollout_diagnostics(groups: list[Any]) -> dict[str, float]:
    """What a step's rollouts did and what its update was told: the mean call count, the
    share of rollouts BFCL passed, and the correlation, within groups, between the rewards
    trained on (shuffled, in a control) and the call count. A control whose shuffled
    rewards happen to favour fewer calls pushes the model where learning would; this shows
    when it did."""
    trajs = [t for g in groups for t in g]
    calls = [float(t.metrics.get("calls", 0)) for t in trajs]
    passes = [float(t.metrics.get("bfcl_pass", False)) for t in trajs]
    centred_r: list[float] = []
    centred_c: list[float] = []
    for g in groups:
        rs, cs = [t.reward for t in g], [float(t.metrics.get("calls", 0)) for t in g]
        centred_r += [r - statistics.fmean(rs) for r in rs]
        centred_c += [c - statistics.fmean(cs) for c in cs]
    spread = any(centred_r) and any(centred_c)
    corr = statistics.correlation(centred_r, centred_c) if spread else 0.0
    return {
        "rollout_calls_mean": round(statistics.fmean(calls), 3),
        "rollout_pass_rate": round(statistics.fmean(passes), 3),
        "trained_reward_calls_correlation": round(corr, 3),
    }


def _rate(results: dict[str, bool]) -> float:
    return statistics.fmean(results.values()) if results else float("nan")


MAX_FAILED_SHARE = 0.25
"""An evaluation whose requests failed more often than this stops the run: its rates would
measure the server, not the model."""


class Tally:
    """An evaluation's verdicts by key ("simple_python/greedy") and item id, and its failures
    counted by BFCL's error type (`error_types`: where the partial credit goes). A request
    that failed counts as a failed item, and its error is kept by key (one slow or lost
    request no longer ends a 45-min run); past MAX_FAILED_SHARE of them the evaluation stops."""

    def __init__(self) -> None:
        self.per_item: dict[str, dict[str, bool]] = {}
        self.errors: dict[str, list[str]] = {}
        self.error_types: dict[str, dict[str, int]] = {}

    def add(self, key: str, item_id: str, answer: dict[str, Any] | bool | str) -> None:
        """`answer`: BFCL's verdict, a bare pass/fail, or a failed request's error."""
        passed = bool(answer["valid"]) if isinstance(answer, dict) else answer is True
        self.per_item.setdefault(key, {})[item_id] = passed
        if passed:
            return
        kind = "unknown"
        if isinstance(answer, str):
            self.errors.setdefault(key, []).append(f"{item_id}: {answer}")
            kind = "request_failed"
        elif isinstance(answer, dict):
            kind = answer.get("error_type", kind)
        counts = self.error_types.setdefault(key, {})
        counts[kind] = counts.get(kind, 0) + 1

    def failed(self) -> int:
        return sum(map(len, self.errors.values()))

    def note(self) -> str:
        return f"; {self.failed()} requests failed, counted as failed items" if self.errors else ""

    def check(self, label: str) -> None:
        total = sum(map(len, self.per_item.values()))
        if self.failed() > MAX_FAILED_SHARE * total:
            first = next(iter(self.errors.values()))[0]
            raise RuntimeError(
                f"{label}: {self.failed()} of {total} requests failed (first: {first})"
            )


def _summary(per_item: dict[str, dict[str, bool]]) -> str:
    return ", ".join(f"{k} {_rate(v):.2f}" for k, v in per_item.items())


def paired(before: dict[str, bool], after: dict[str, bool]) -> dict[str, float]:
    """Mean rise over the same items and its standard error (paired differences)."""
    diffs = [float(after[i]) - float(before[i]) for i in before]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {
        "before": round(_rate(before), 3),
        "after": round(_rate(after), 3),
        "rise": round(statistics.fmean(diffs), 3),
        "se": round(se, 3),
    }


def trainable_model(args: argparse.Namespace) -> art.TrainableModel:
    """The run's model: named by its arm and seed, in project "bfcl"."""
    return art.TrainableModel(
        name=f"bfcl-{'control' if args.control else 'rl'}-s{args.seed}",
        project="bfcl",
        base_model=args.base_model,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.monotonic()
    commit, code = commit_stamp(), code_hash()  # the code that runs: read before the run's minutes
    out = Path(args.out)
    bfcl = Run(args)
    rng = random.Random(args.seed)
    phases: dict[str, float] = {}
    memory = PhasePeaks()  # the peak of each phase, model loading counted in the first
    try:
        model = trainable_model(args)
        await model.register(art.LocalBackend(path=out / "art"))
        before = await bfcl.evaluate(model, "untrained")
        phases["untrained evaluation"] = before["seconds"]
        memory.end("untrained evaluation")
        steps: list[dict[str, Any]] = []
        at_steps: dict[str, dict[str, Any]] = {}
        for step in range(args.steps):
            t0 = time.monotonic()
            groups = await bfcl.step_groups(model, rng, step)
            t1 = time.monotonic()
            memory.end("rollouts")
            rewards = [t.reward for g in groups for t in g]
            if args.control:  # the same update with the rewards dealt to other rollouts
                shuffled = rewards[:]
                rng.shuffle(shuffled)
                for t, r in zip((t for g in groups for t in g), shuffled, strict=True):
                    t.reward = r
            trained = await model.train(groups, art.TrainConfig(**json.loads(args.train_config)))
            t2 = time.monotonic()
            memory.end("training")
            steps.append(
                {
                    "step": step + 1,
                    "reward": round(statistics.fmean(rewards), 3),
                    **rollout_diagnostics(groups),
                    "rollouts_s": round(t1 - t0, 1),
                    "train_s": round(t2 - t1, 1),
                    "metrics": trained.metrics,
                }
            )
            print(
                f"step {step + 1}: reward {steps[-1]['reward']:.3f}, rollouts {t1 - t0:.0f} s, "
                f"training {t2 - t1:.0f} s"
            )
            if step + 1 in args.eval_at:  # the model a run of step + 1 steps would end with
                mid = await bfcl.evaluate(model, f"after {step + 1} steps")
                phases[f"evaluation after {step + 1} steps"] = mid["seconds"]
                at_steps[str(step + 1)] = _compare(before, mid)
                memory.end("intermediate evaluations")
        phases["rollouts"] = round(sum(s["rollouts_s"] for s in steps), 1)
        phases["training"] = round(sum(s["train_s"] for s in steps), 1)
        after = await bfcl.evaluate(model, f"after {args.steps} steps")
        phases["final evaluation"] = after["seconds"]
        memory.end("final evaluation")
    finally:
        bfcl.checker.close()
    final = _compare(before, after)
    table, greedy_rise, greedy_se = (
        final[k] for k in ("accuracy", "calling_mean_greedy_rise", "calling_mean_greedy_se")
    )
    result = {
        "commit": commit,
        "code": code,
        "args": vars(args),
        "cpu_flags": matmul_flags(),  # caps included: a capped host is labelled so
        "allocator": allocator_in_use(),
        "wall_s": round(time.monotonic() - start, 1),
        "peak_rss_gib": memory.overall(),
        "peak_rss_gib_by_phase": memory.peaks,
        "peak_rss_phases_apart": memory.resettable,  # False: each phase's mark includes earlier ones
        "phases_s": phases,
        "steps": steps,
        "accuracy": table,
        "calling_mean_greedy_rise": greedy_rise,
        "calling_mean_greedy_se": greedy_se,  # the categories' paired s.e.s pooled
        "at_steps": at_steps,  # --eval-at's evaluations, each against the untrained model
        "per_item": {"before": before["per_item"], "after": after["per_item"]},
        "failed_requests": {"before": before["errors"], "after": after["errors"]},
        "error_types": {"before": before["error_types"], "after": after["error_types"]},
    }
    with atomic_write(out / "result.json") as f:
        f.write(json.dumps(result, indent=1, default=str))
    where = "held-out sample" if args.eval_split == "heldout" else "validation slice"
    print(f"| BFCL {where} | before | after | rise ± s.e. |\n|---|---:|---:|---:|")
    for key, row in table.items():
        print(
            f"| {key} | {row['before']:.2f} | {row['after']:.2f} | {row['rise']:+.2f} ± {row['se']:.2f} |"
        )
    print(f"mean greedy rise over the calling categories: {greedy_rise:+.3f} ± {greedy_se:.3f}")
    return result


def _compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Two evaluations' paired table per key, and the mean greedy rise over the calling
    categories with its s.e. (the categories' paired s.e.s pooled)."""
    table = {k: paired(before["per_item"][k], after["per_item"][k]) for k in before["per_item"]}
    calling = [c for c in CALLING if f"{c}/greedy" in table]
    se = math.sqrt(sum(table[f"{c}/greedy"]["se"] ** 2 for c in calling)) / len(calling)
    return {
        "accuracy": table,
        "calling_mean_greedy_rise": round(
            statistics.fmean(table[f"{c}/greedy"]["rise"] for c in calling), 3
        ),
        "calling_mean_greedy_se": round(se, 3),
    }


def parser() -> argparse.ArgumentParser:
    """The example's command line."""
    ap = argparse.ArgumentParser(description="GRPO on BFCL through the LangGraph swap-in")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--control", action="store_true", help="shuffle each step's rewards")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--base-model", default="smollm2-135m")
    ap.add_argument("--out", default="runs/bfcl")
    ap.add_argument(
        "--eval-limit",
        type=int,
        default=None,
        help="evaluate only the first N items of each category's sample (smoke tests)",
    )
    ap.add_argument(
        "--eval-categories",
        default=",".join(TRAINABLE),
        help="the held-out categories evaluated (comma-separated; the CI arm evaluates fewer)",
    )
    ap.add_argument(
        "--eval-split",
        choices=("heldout", "validation"),
        default="heldout",
        help="heldout: the fixed held-out sample (the reported figures); validation: the "
        "training half's validation slice, whole (for choices, never reported as results)",
    )
    ap.add_argument(
        "--train-categories",
        default=",".join(TRAINED),
        help="the categories steps draw their items from, in turn (comma-separated; one "
        "named twice gets twice the share)",
    )
    ap.add_argument(
        "--train-config",
        default="{}",
        help="TrainConfig fields that differ from its defaults, as JSON (a sweep's arm, e.g. "
        '\'{"flat_groups": "batch_baseline"}\'); default: none, TrainConfig\'s defaults',
    )
    ap.add_argument(
        "--decline-reward",
        choices=("any", "once", "tiebreak"),
        default="any",
        help="the reward of an irrelevance pass by n `decline` calls: any (1.0 whatever n), "
        "once (1/n) or tiebreak (0.9 for n > 1); BFCL passes them all",
    )
    ap.add_argument(
        "--eval-modes",
        default="greedy,sampled",
        help="greedy (as BFCL evaluates) and/or sampled at T=1, comma-separated",
    )
    ap.add_argument(
        "--eval-at",
        type=lambda v: sorted({int(x) for x in v.split(",") if x}),
        default=[],
        help="steps (comma-separated, each before --steps) after which the run also "
        "evaluates, as a run of that many steps would end: the curve of a choice of steps",
    )
    return ap


def _check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Refuse an evaluation that could not yield the headline: unknown names, or no
    calling category evaluated greedy."""
    cats, modes = args.eval_categories.split(","), args.eval_modes.split(",")
    unknown = (
        set(cats) - set(TRAINABLE)
        or set(modes) - {"greedy", "sampled"}
        or set(args.train_categories.split(",")) - set(TRAINABLE)
    )
    if unknown:
        raise SystemExit(
            f"--eval-categories/--eval-modes/--train-categories: unknown {sorted(unknown)}"
        )
    try:
        art.TrainConfig(**json.loads(args.train_config))
    except (ValueError, TypeError) as e:
        raise SystemExit(f"--train-config: {e}") from None
    if any(not 0 < n < args.steps for n in args.eval_at):
        raise SystemExit(f"--eval-at: each step must lie in 1..{args.steps - 1}")
    if "greedy" not in modes or not set(cats) & set(CALLING):
        raise SystemExit("the headline needs a calling category evaluated greedy")
    return args


def main(argv: list[str] | None = None) -> None:
    if (
        argv is None
    ):  # run as a program: on tcmalloc where installed (art_langgraph/runtime/allocator.py)
        art.reexec_with_tcmalloc()
    asyncio.run(run(_check_args(parser().parse_args(argv))))
