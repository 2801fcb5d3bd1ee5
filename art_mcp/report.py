"""What an `art_mcp.train` run did, rebuilt from what it saved: the run journal and history.

A run can stop anywhere (Ctrl-C, a crash, a killed machine) and the same command resumes
it, so the report is never kept in memory across phases. It is rebuilt, each time it is
written, from two append-only records in the model's folder:

- `history.jsonl`, the backend's record of every committed step (the source of truth for
  which GRPO steps exist and their train metrics; `_grpo_records`);
- `evaluations.jsonl`, this harness's journal: one line per finished held-out evaluation
  (`Evaluation`), and one line per GRPO step as the harness saw it (for a remote backend,
  whose history is not on this machine). A line is written whole or, when the process dies
  mid-write, left torn and skipped on reading.

So a resumed run's report is the one an uninterrupted run writes, and an evaluation cut off
by an interrupt is run again, labelled by the GRPO steps really done before it.

`write_report` renders report.json, report.md and reward_curve.png (matplotlib optional).
With a Langfuse review queue (`--review-queue`), the judge's agreement with the human
reviews (`review_calibration.json`, see art_langgraph/rewards/calibration.py) is reported
too, with a warning when it is low.

Left out: wall time across runs (`Report.seconds` counts the last process only).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from art_langgraph.backend.checkpoints import CheckpointFolder
from art_langgraph.rewards.calibration import JudgeCalibration
from art_langgraph.trajectories.records import append_records, read_records
from art_langgraph.utils import atomic_write
from art_mcp.evaluation import Evaluation

JOURNAL = "evaluations.jsonl"
"""The harness's journal in the model folder (see the module doc)."""


class Report(BaseModel):
    """What a harness run did; also written as report.json/.md/.png in the model folder."""

    model: str
    server: str
    steps: int
    rows: list[dict[str, float]] = Field(default_factory=list)
    """One row per RL step: step (the checkpoint), rl_step (0 = before RL), val_reward (NaN
    where not evaluated), train_reward, and for GRPO steps zero_variance_groups, groups and
    nothing_trainable (1: the step trained on nothing, see `untrained_steps`)."""
    val_reward_untrained: float | None = None
    """Held-out reward of the base model, before the SFT warm start (None: no warm start)."""
    val_reward_before: float | None = None
    """Held-out reward before the first RL step (after any warm start): RL step 0."""
    val_reward_after: float | None = None
    """Held-out reward at the last evaluation."""
    val_reward_best: float | None = None
    """Best held-out reward after RL step 0."""
    ended_after: int | None = None
    """The RL step after which RL ended before `steps`, because `stop_when_flat` steps in a
    row had trained on nothing; None: it did not end early."""
    untrained_steps: list[int] = Field(default_factory=list)
    """RL steps that trained on nothing: every group had one reward for all its rollouts
    (or was empty or stale). Such a step still advances the checkpoint, with the adapter
    unchanged; the curve marks it."""
    scored_by: str = ""
    """What scored the held-out episodes: "reward" (your function), "judge" (RULER, relative
    within each scenario's episodes) or "judge, over the reward" (as training does)."""
    evaluations: list[Evaluation] = Field(default_factory=list)
    """Every held-out evaluation, the untrained model's first."""
    paired: dict[str, dict[str, float]] = Field(default_factory=dict)
    """"greedy"/"sampled" -> RL's paired per-scenario rise in success, from the evaluation
    before RL (the untrained model's, or the one after an SFT warm start) to the last:
    {"rise", "se", "n", "before", "after"}; the error is clustered by entity when the
    scenarios name one (`paired_rise`)."""
    slices: dict[str, dict[str, dict[str, float]]] = Field(default_factory=dict)
    """Scenario slice (`metadata["slice"]`: "wording unseen", "two-hop", ...) -> the same
    paired figures over that slice's held-out scenarios alone."""
    warm_start: dict[str, dict[str, dict[str, float]]] = Field(default_factory=dict)
    """After an SFT warm start: "all" and each slice -> "greedy"/"sampled" -> the paired
    rise from the untrained model to the evaluation before RL, the warm start's own share,
    reported apart from RL's; empty without a warm start."""
    calls: dict[str, dict[str, float]] = Field(default_factory=dict)
    """"all" and each slice -> calls per solved held-out episode (greedy and sampled),
    before RL and at the last evaluation: {"before", "after", "repeated_before",
    "repeated_after", "solved_before", "solved_after"} (`Evaluation.calls_per_solved`)."""
    examples: list[dict[str, Any]] = Field(default_factory=list)
    """A few held-out scenarios whose greedy episode changed, before and after."""
    seconds: float = 0.0
    folder: str = ""
    judge_calibration: JudgeCalibration | None = None
    """The RULER judge against the human reviews of the run's review queue, when it has one
    (review_calibration.json in the folder); its `warning` is set when agreement is low."""


# --------------------------------------------------------------------------- journal
def append_journal(folder: Path, kind: str, data: dict[str, Any]) -> None:
    """Append one line {"kind": kind, **data} to the journal and flush it to disk."""
    append_records(folder / JOURNAL, [{"kind": kind, **data}])


def read_journal(folder: Path) -> list[dict[str, Any]]:
    """The journal's records (a last line torn by a killed process is skipped)."""
    return read_records(folder / JOURNAL, missing_ok=True)


def journal_evaluations(journal: list[dict[str, Any]]) -> list[Evaluation]:
    """The evaluations in a journal, in the order they finished."""
    evs = []
    for item in journal:
        if item.get("kind") == "evaluation":
            evs.append(Evaluation.model_validate({k: v for k, v in item.items() if k != "kind"}))
    return evs


def _grpo_records(folder: Path) -> list[dict[str, Any]] | None:
    """The GRPO steps committed in this folder's history.jsonl (SFT steps left out), in
    order; None when there is no history here (a remote backend keeps it)."""
    model = CheckpointFolder(folder)
    if not model.history_file.exists():
        return None
    return [h for h in model.history() if h.get("split") == "train" and "sft_steps" not in h]


def grpo_steps(folder: Path, journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per GRPO step done: {"step", "reward", "zero_variance_groups", "groups",
    "nothing_trainable"} from history.jsonl, else from the journal's step lines."""
    found = _grpo_records(folder)
    if found is None:
        found = [item for item in journal if item.get("kind") == "step"]
    return found


# --------------------------------------------------------------------------- rebuild
def _nan(x: Any) -> float:
    return float(x) if isinstance(x, int | float) else float("nan")


def eval_row(ev: Evaluation) -> dict[str, float]:
    s = ev.summary()
    return {
        "val_reward": ev.greedy_reward,
        "val_greedy_success": s["greedy_success"],
        "val_sampled_success": s["sampled_success"],
        "val_format": s["sampled_format"] if ev.sampled else s["greedy_format"],
    }


def flat_run(records: list[dict[str, Any]]) -> int:
    """How many of the last GRPO steps (`grpo_steps` records), in a row, trained on nothing."""
    run = 0
    for h in reversed(records):
        if h.get("nothing_trainable") != 1:
            break
        run += 1
    return run


def evaluated_weights(
    evaluations: list[Evaluation], records: list[dict[str, Any]]
) -> Evaluation | None:
    """The latest evaluation when no GRPO step after it (`grpo_steps` records) trained on
    anything: the adapter now is the one it evaluated (a step that trains on nothing carries
    its adapter forward unchanged), so a new evaluation would sample the same weights again.
    None when there is no evaluation, or a later step trained."""
    if not evaluations:
        return None
    last = max(evaluations, key=lambda e: e.step)
    later = [h for h in records if _nan(h.get("step")) > last.step]
    return last if all(h.get("nothing_trainable") == 1 for h in later) else None


def build_report(
    *,
    model: str,
    server: str,
    steps: int,
    stop_when_flat: int = 0,
    folder: Path,
    scored_by: str,
    seconds: float,
    scenarios: list[Any],
) -> Report:
    """The report of everything saved so far in `folder` (see the module doc)."""
    from art_mcp.evaluation import changed_examples, entity_clusters, paired_rise, slices

    journal = read_journal(folder)
    evs = journal_evaluations(journal)
    report = Report(
        model=model,
        server=server,
        steps=steps,
        folder=str(folder),
        scored_by=scored_by,
        seconds=seconds,
        evaluations=evs,
    )
    untrained = next((e for e in evs if e.step == 0), None)
    report.val_reward_untrained = untrained.greedy_reward if untrained else None
    before = next((e for e in reversed(evs) if e.rl_step == 0), None)
    if before is not None:
        report.rows.append(
            {
                "step": float(before.step),
                "rl_step": 0.0,
                "train_reward": float("nan"),
                **eval_row(before),
            }
        )
    done = grpo_steps(folder, journal)
    if stop_when_flat and len(done) < steps and flat_run(done) >= stop_when_flat:
        report.ended_after = len(done)
    nexts = [h["step"] for h in done[1:]] + [float("inf")]
    for i, (h, upto) in enumerate(zip(done, nexts, strict=False), start=1):
        row: dict[str, float] = {
            "step": float(h["step"]),
            "rl_step": float(i),
            "val_reward": float("nan"),
            "train_reward": _nan(h.get("reward")),
            "zero_variance_groups": _nan(h.get("zero_variance_groups")),
            "groups": _nan(h.get("groups")),
            "nothing_trainable": _nan(h.get("nothing_trainable")),
        }
        # this step's weights: its checkpoint, or a replay's after it (`sft_replay`)
        ev = next((e for e in reversed(evs) if e.rl_step == i and h["step"] <= e.step < upto), None)
        if ev is not None:
            row.update(eval_row(ev))
        if row["nothing_trainable"] == 1:
            report.untrained_steps.append(i)
        report.rows.append(row)
    vals = [r["val_reward"] for r in report.rows if _ok(r.get("val_reward"))]
    report.val_reward_before = vals[0] if vals else None
    report.val_reward_after = vals[-1] if vals else None
    report.val_reward_best = max(vals[1:]) if len(vals) > 1 else None
    with contextlib.suppress(OSError, ValueError):
        text = (folder / "review_calibration.json").read_text(encoding="utf-8")
        report.judge_calibration = JudgeCalibration.model_validate_json(text)
    rl_evals = [e for e in evs if e.rl_step > 0]
    clusters = entity_clusters(scenarios)
    labelled = {"all": None, **dict(sorted(slices(scenarios).items()))}

    def rise(a: Evaluation, b: Evaluation, ids: set[str] | None) -> dict[str, dict[str, float]]:
        return {k: paired_rise(a, b, k, clusters, ids) for k in ("greedy", "sampled")}

    if untrained is not None and before is not None and before.step != 0:
        report.warm_start = {label: rise(untrained, before, ids) for label, ids in labelled.items()}
    if before is not None and rl_evals:
        last = rl_evals[-1]
        report.paired = rise(before, last, None)
        report.slices = {label: rise(before, last, ids) for label, ids in labelled.items() if ids}
        for label, ids in labelled.items():
            a, b = before.calls_per_solved(ids), last.calls_per_solved(ids)
            if a["solved"] or b["solved"]:
                report.calls[label] = {
                    "before": a["calls"],
                    "after": b["calls"],
                    "repeated_before": a["repeated"],
                    "repeated_after": b["repeated"],
                    "solved_before": a["solved"],
                    "solved_after": b["solved"],
                }
        # one example of each slice first (a two-hop episode beside a one-hop one), then any
        picked = [
            ex
            for ids in labelled.values()
            if ids
            for ex in changed_examples(evs[0], last, scenarios, 1, ids)
        ]
        seen = {ex["scenario"] for ex in picked}
        rest = [
            ex for ex in changed_examples(evs[0], last, scenarios) if ex["scenario"] not in seen
        ]
        report.examples = (picked + rest)[: max(3, len(picked))]
    return report


# --------------------------------------------------------------------------- render
def eval_line(ev: Evaluation) -> str:
    s = ev.summary()
    line = f"greedy success {_fmt(s['greedy_success'])}"
    if ev.sampled:
        line += (
            f", sampled success {_fmt(s['sampled_success'])}, format {_fmt(s['sampled_format'])}"
        )
    return line + f" (reward {_fmt(s['greedy_reward'])})"


def _fmt(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.2f}"


def _ok(x: float | None) -> bool:
    return x is not None and x == x


def summary_lines(report: Report) -> list[str]:
    """The report's headline: held-out success of the untrained model, after any warm
    start, after RL; the paired rise; steps that trained nothing; the wall time."""
    evs = report.evaluations
    if not evs:
        return [f"- wall time: {report.seconds:.0f} s"]
    n = len(evs[0].greedy)
    k = max((len(v) for v in evs[0].sampled.values()), default=0)
    by = f"; scored by the {report.scored_by}" if report.scored_by else ""
    out = [
        f"- held-out: {n} scenarios never trained on; greedy, and {k} samples at temperature 1{by}"
        if k
        else f"- held-out: {n} scenarios never trained on, greedy{by}"
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
        out.append(f"- {label}: {eval_line(ev)}")
    first = next((e for e in reversed(evs) if e.rl_step == 0), evs[0])  # RL's baseline
    start = "untrained" if first.step == 0 else "before RL"
    for kind in ("sampled", "greedy"):
        p = report.paired.get(kind)
        if p and _ok(p.get("rise")):
            out.append(
                f"- paired rise in {kind} success, {start} -> last: {p['rise']:+.2f} "
                f"(± {_fmt(p['se'])} s.e., {int(p['n'])} scenarios)"
            )
    out += _slice_lines(report.slices, "")
    out += _slice_lines(report.warm_start, "the SFT warm start, untrained -> before RL, ")
    for label, c in report.calls.items():
        out.append(
            f"- calls per solved episode ({label}), {start} -> last: {_fmt(c['before'])} -> "
            f"{_fmt(c['after'])}, of which repeated {_fmt(c['repeated_before'])} -> "
            f"{_fmt(c['repeated_after'])} ({int(c['solved_before'])} and "
            f"{int(c['solved_after'])} solved episodes)"
        )
    rl = [e for e in evs if e.rl_step > 0]
    before = [e for e in evs if e.rl_step == 0]
    if rl and before:
        share = rl[-1].greedy_reward - before[-1].greedy_reward
        out.append(f"- RL's own contribution to the greedy reward: {share:+.2f}")
    if report.untrained_steps:
        steps = _ranges(report.untrained_steps)
        out.append(
            f"- {len(report.untrained_steps)} of {len(report.rows) - 1} RL steps trained on "
            f"nothing (every group's rollouts had one reward): step {steps}"
        )
    if report.ended_after is not None:
        out.append(
            f"- RL ended after step {report.ended_after} of {report.steps}: the last steps "
            "trained on nothing, in a row (`stop_when_flat`)"
        )
    cal = report.judge_calibration
    if cal is not None and cal.pairs:
        out.append(f"- {cal.line()}")
        if cal.warning:
            out.append(f"- WARNING: {cal.warning}")
    out.append(f"- wall time: {report.seconds:.0f} s")
    return out


def _slice_lines(by_label: dict[str, dict[str, dict[str, float]]], prefix: str) -> list[str]:
    """One line per slice: sampled and greedy success before -> after, with the rise."""
    out = []
    for label, by_kind in by_label.items():
        parts = [
            f"{kind} {_fmt(p.get('before'))} -> {_fmt(p.get('after'))} "
            f"({p['rise']:+.2f} ± {_fmt(p['se'])})"
            for kind in ("sampled", "greedy")
            if (p := by_kind.get(kind)) and _ok(p.get("rise"))
        ]
        if parts:
            n = int(next(iter(by_kind.values()))["n"])
            out.append(f"- {prefix}{label} ({n} scenarios): " + "; ".join(parts))
    return out


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3, 5"."""
    out: list[str] = []
    start = prev = steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(out)


def _example_lines(report: Report) -> list[str]:
    if not report.examples:
        return []
    first = report.evaluations[0] if report.evaluations else None
    since = "untrained" if first is None or first.step == 0 else "before RL"
    out = ["", f"## Held-out episodes that changed (greedy, {since} -> last)", ""]
    for ex in report.examples:
        out += [
            f"**{ex['task']}**" + (f" ({ex['slice']})" if ex.get("slice") else ""),
            "",
            f"- before (reward {_fmt(ex['before_reward'])}): `{ex['before']}`",
            f"- after (reward {_fmt(ex['after_reward'])}): `{ex['after']}`",
            "",
        ]
    return out


def write_report(report: Report, folder: Path) -> None:
    """report.json, report.md and reward_curve.png in `folder`, each written atomically."""
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
        "| RL step | train reward | held-out reward | trained |",
        "|---:|---:|---:|:---|",
        *(
            f"| {int(r.get('rl_step', r['step']))} | {_fmt(r.get('train_reward'))} | "
            f"{_fmt(r.get('val_reward'))} | {_trained(r)} |"
            for r in report.rows
        ),
        "",
        "![reward curve](reward_curve.png)",
        *_example_lines(report),
    ]
    put("report.md", "\n".join(lines) + "\n")
    # matplotlib is optional: the JSON and markdown reports are written without it
    with contextlib.suppress(ImportError):
        _plot(report, folder)


def _trained(row: dict[str, float]) -> str:
    if not row.get("rl_step"):
        return "-"
    if row.get("nothing_trainable") == 1:
        return "nothing (no group had variance)"
    zv, groups = row.get("zero_variance_groups", math.nan), row.get("groups", math.nan)
    if _ok(zv) and _ok(groups):
        return f"{int(groups - zv)} of {int(groups)} groups"
    return "yes"


def _plot(report: Report, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)

    def x(r: dict[str, float]) -> float:
        return r.get("rl_step", r["step"])

    pts = [(x(r), r["val_reward"]) for r in report.rows if _ok(r.get("val_reward"))]
    trained = [r for r in report.rows if _ok(r.get("train_reward"))]
    tr = [(x(r), r["train_reward"]) for r in trained]
    idle = [(x(r), r["train_reward"]) for r in trained if r.get("nothing_trainable") == 1]
    if tr:
        ax.plot(*zip(*tr, strict=True), marker="o", label="train reward")
    if idle:
        ax.plot(
            *zip(*idle, strict=True),
            ls="none",
            marker="x",
            color="red",
            markersize=9,
            label="trained nothing",
        )
    if pts:
        ax.plot(*zip(*pts, strict=True), marker="s", label="held-out reward")
    won = [
        (x(r), r["val_sampled_success"]) for r in report.rows if _ok(r.get("val_sampled_success"))
    ]
    if won:
        ax.plot(*zip(*won, strict=True), marker="^", label="held-out success (sampled)")
    if (untrained := report.val_reward_untrained) is not None and _ok(untrained):
        ax.axhline(untrained, color="grey", ls=":", label="untrained")
    ax.set_xlabel("RL step (0: before RL)")
    ax.set_ylabel("reward, success")
    ax.set_title(f"{report.model}: GRPO over MCP")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    with atomic_write(folder / "reward_curve.png", "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
