"""Does RL make the real model better? `art-mcp train` over several seeds and a control arm.

Each run is `art-mcp train` as a user runs it (the library's defaults, plus only the
task's server, scenarios and reward, and `--seed`), in a child process of its own, one
after another: `--seeds` seeds, then the control runs (`--shuffle-rewards true`: the same run
with each step's rewards permuted across its rollouts, so whatever it gains is not
learning from the reward). Each run's report gives the held-out success before RL (the
untrained model's, or after the SFT warm start when the scenarios carry demonstrations)
and after the last step, greedy and sampled at temperature 1, paired per scenario, with
the warm start's own rise and the calls per solved episode apart; its peak RSS and wall
time are measured here.

    .venv/bin/python -m bench.learning [--task capitals|books|directory|org] [--seeds 1,2,3,4,5]
        [--controls 1,2,3] [--extra "--learning-rate 1e-4"] [--tag NAME] [--keep DIR]
    .venv/bin/python -m bench.learning --task capitals --combine [--tag ci]
    .venv/bin/python -m bench.learning --compare amxbf16

`--task`: the bundled capital/currency task (examples/mcp_server, the demo's), the book
facts task (examples/mcp_books, never used to choose a default), the staff directory
(examples/mcp_directory) or the two-hop org chart (examples/mcp_org, whose table breaks
the rise down into one-hop and two-hop questions). Writes
bench/results/learning/learning_<task>[_<tag>].json,
docs/learning_band_<task>.png (train reward per step, the seeds' band against the
control's) and the docs table between its markers (the JSON after each run, so a stop
loses at most the run under way); `--keep DIR` keeps the runs' logs and models in a new
folder instead of a temporary one. Runs may also be made one at a time, each with its own
`--tag`; `--combine`
gathers every bench/results/learning/learning_<task>_<tag>.json of the defaults (no
flags, or only the task's evaluation flags, `TASK_EVAL`) into
learning_<task>.json, the plot and the docs table; `--combine --tag ci` gathers the runs
tagged ci_* (made with the same `--extra`: the CI learning test's arguments) into
learning_<task>_ci.json and its docs table, with the margin a test may require. Results
are pooled per class of host (`host_key`: AVX2; AMX or AVX512-BF16, where bf16 is fast
but `auto` keeps a model this small in fp32, `devices.FLOAT32_MAX_PARAMS`), never across:
their speed differs. Each class gets its own file
(`_amx` and so on after the name; AVX2's has none), table and plot, and the README's
headline a row per class. `--compare TAG` sets each run of the defaults beside the same
run tagged TAG (a dtype, say) on the same host class, for both tasks.

Each run is supervised by the project's watchdog (`run_watched`): it stops when this
bench stops or dies, however it died.

Left out: running seeds side by side (2 cores: they would only share them).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from art_mcp.evaluation import Evaluation
from bench.memory import tree_peak_rss_mib
from bench.readme import results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
RESULTS = results_dir("learning")
"""bench/results/learning/: every run's and every pooled table's JSON."""
TASKS = {
    "capitals": ("examples.mcp_server.server", "examples/mcp_server", "examples.mcp_server.tasks"),
    "books": ("examples.mcp_books.server", "examples/mcp_books", "examples.mcp_books.tasks"),
    "directory": (
        "examples.mcp_directory.server",
        "examples/mcp_directory",
        "examples.mcp_directory.tasks",
    ),
    "org": ("examples.mcp_org.server", "examples/mcp_org", "examples.mcp_org.tasks"),
}
"""Task name -> its server module, folder (scenarios.jsonl) and reward module."""
TASK_EVAL = {"org": ["--eval-scenarios", "48", "--eval-every", "3"]}
"""Evaluation flags a task's runs take before `--extra`'s (which may override one): they
change what is measured, never what is trained. The org chart evaluates 48 held-out
scenarios, not the default 24 (its two-hop slice, about 40% of them, needs more), and once
mid-run, for the success curve."""


def of_the_defaults(task: str, extra: list[str]) -> bool:
    """Whether runs made with `extra` are runs of the defaults: no flags, or only the
    task's evaluation flags (`TASK_EVAL`)."""
    return not extra or extra == TASK_EVAL.get(task)


def task_parts(task: str, scenarios: Path | None = None) -> tuple[str, str, str]:
    """A task's server command, scenarios file (`scenarios`: another file of them, a
    validation slice) and reward, as `art-mcp train` takes them."""
    server, folder, reward = TASKS[task]
    return (
        f"{sys.executable} -m {server}",
        str(scenarios or f"{folder}/scenarios.jsonl"),
        f"{reward}:score",
    )


def task_args(task: str, scenarios: Path | None = None) -> list[str]:
    """The `art-mcp train` flags of a task: its server, scenarios and reward, nothing else."""
    server, file, reward = task_parts(task, scenarios)
    return ["--server", server, "--scenarios", file, "--reward", reward]


def validation_file(task: str, folder: Path) -> Path:
    """The task's validation slice (`art_mcp.scenarios.validation_scenarios`: a quarter of
    its training entities held out, and of their wordings where the scenarios name them; its
    held-out scenarios dropped), written into `folder`: what a choice of setting is made on."""
    from art_mcp.scenarios import load_scenarios, save_scenarios, validation_scenarios

    path = folder / f"{task}_validation.jsonl"
    save_scenarios(
        path, validation_scenarios(load_scenarios(ROOT / TASKS[task][1] / "scenarios.jsonl"))
    )
    return path


def host_key(machine: str) -> str:
    """The class of host a result was measured on, from its machine line's CPU flags: "amx"
    and "avx512bf16" (bf16 in hardware) or "avx2". Results of different classes are never
    pooled: their speed differs, and with it what a run may use. A host whose instruction
    sets the environment capped (`devices.ISA_CAP_VARIABLES`; in this project only ever at
    AVX2, to compute on an AMX host as on an AVX2 one) is "avx2cap", pooled apart too."""
    if "instruction sets capped" in machine:
        return "avx2cap"
    if "amx_bf16" in machine:
        return "amx"
    if "avx512_bf16" in machine:
        return "avx512bf16"
    return "avx2"


HOST_LABEL = {
    "amx": "AMX, fp32",
    "avx512bf16": "AVX512-BF16, fp32",
    "avx2": "AVX2, fp32",
    "avx2cap": "AMX capped at AVX2, fp32",
}
"""How a table names a host class: its matmul flags and the dtype `auto` picks there for
SmolLM2-135M (`devices.pick_engine_dtype`)."""


def host_suffix(host: str) -> str:
    """The file and marker suffix of a host class's results: none for AVX2 (the first class
    measured, whose names predate the others), `_<class>` for the rest."""
    return "" if host == "avx2" else f"_{host}"


def run_watched(
    name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> tuple[int, float]:
    """Run `cmd` (from this process's folder: `main` runs from the repository root) under
    the project's watchdog (`WatchedProcess`), its output in `log`, until it ends: its exit code and peak RSS in MiB (its process
    tree's, the watchdog's own left out). It does not outlive this process: an error or
    Ctrl-C here stops it, and so does this process's death, however it died (SIGKILL
    included: the watchdog reads EOF on its pipe and stops the run's whole group). `env`:
    its environment (None: this process's)."""
    from art_langgraph.runtime.watchdog import WATCHDOG, WatchedProcess

    child = WatchedProcess(name, log)
    log.write_bytes(b"")
    child.start(
        lambda fd: [sys.executable, "-c", WATCHDOG, str(fd), *cmd],
        os.environ if env is None else env,
        header=" ".join(cmd),
        ready=lambda: True,
        timeout_s=60.0,
    )
    peak = 0.0
    try:
        while (pid := child.pid) is not None and child.alive():
            peak = max(peak, tree_peak_rss_mib(pid, root=False))
            time.sleep(1.0)
        return int(child.returncode or 0), peak
    finally:  # the bench stopped (an error, Ctrl-C, SIGTERM): the run goes with it
        child.stop()


def run_one(
    task: str,
    seed: int,
    control: bool,
    extra: list[str],
    folder: Path,
    name: str | None = None,
    scenarios: Path | None = None,
) -> dict[str, Any]:
    """One `art-mcp train` run; its report's figures, wall time, peak RSS and commit."""
    from examples.bfcl.record import commit_stamp

    name = name or f"{'control' if control else 'seed'}-{seed}"
    commit = commit_stamp()
    cmd = [sys.executable, "-m", "art_mcp.cli", "train", *task_args(task, scenarios)]
    cmd += ["--seed", str(seed)]
    cmd += ["--path", str(folder), "--name", name, *extra]
    if control:
        cmd += ["--shuffle-rewards", "true"]
    t0 = time.perf_counter()
    log = folder / f"{name}.log"  # a file, not a pipe: a chatty child never blocks on it
    returncode, peak = run_watched(name, cmd, log)
    wall = time.perf_counter() - t0
    tail = log.read_text()[-3000:]
    if returncode != 0:
        raise RuntimeError(f"{name} failed ({returncode}):\n{tail}")
    report = json.loads((folder / "mcp" / "models" / name / "report.json").read_text())
    row = {"run": name, "commit": commit, "seed": seed, "control": control}
    return {
        **row,
        "wall_s": wall,
        "peak_rss_mib": peak,
        **report_row(report),
        "log_tail": tail[-1500:],
    }


def report_row(report: dict[str, Any]) -> dict[str, Any]:
    """A run's figures from its report.json: held-out success before RL (after any warm
    start) and at the last evaluation, the untrained model's, the paired rises, slices,
    warm start and calls, the curves and the changed examples."""
    evs = [Evaluation.model_validate(e) for e in report["evaluations"]]
    # RL's baseline is the evaluation before RL: the untrained model's, or after a warm start
    untrained = next((e for e in evs if e.step == 0), None)  # None: --eval-untrained false
    first, last = [e for e in evs if e.rl_step == 0][-1], evs[-1]
    return {
        "evaluated": len(first.greedy),
        "samples": max((len(v) for v in first.sampled.values()), default=0),
        "greedy_before": first.greedy_success,
        "greedy_after": last.greedy_success,
        "sampled_before": first.sampled_success,
        "sampled_after": last.sampled_success,
        "format_before": first.sampled_format,
        "format_after": last.sampled_format,
        "untrained_greedy": untrained.greedy_success if untrained else None,
        "untrained_sampled": untrained.sampled_success if untrained else None,
        "paired": report.get("paired", {}),
        "slices": report.get("slices", {}),
        "warm_start": report.get("warm_start", {}),
        "calls": report.get("calls", {}),
        "success_curve": [
            [r["rl_step"], r["val_sampled_success"]]
            for r in report["rows"]
            if isinstance(r.get("val_sampled_success"), int | float)
            and r["val_sampled_success"] == r["val_sampled_success"]
        ],
        "train_reward": [r.get("train_reward") for r in report["rows"][1:]],
        "zero_variance_groups": [r.get("zero_variance_groups") for r in report["rows"][1:]],
        "groups": [r.get("groups") for r in report["rows"][1:]],
        "examples": report.get("examples", []),
    }


def _band_plot(rows: list[dict[str, Any]], task: str, suffix: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for control, colour, label in (
        (False, "tab:blue", "RL (seeds)"),
        (True, "tab:grey", "control"),
    ):
        curves = [r["train_reward"] for r in rows if r["control"] == control and r["train_reward"]]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = list(range(1, n + 1))
        cols = [[c[i] for c in curves] for i in range(n)]
        ax.fill_between(xs, [min(c) for c in cols], [max(c) for c in cols], color=colour, alpha=0.2)
        ax.plot(
            xs, [statistics.fmean(c) for c in cols], color=colour, label=f"{label}, n={len(curves)}"
        )
    ax.set_xlabel("RL step")
    ax.set_ylabel("train reward (mean, min-max band)")
    ax.set_title(f"SmolLM2-135M, {task}: RL against shuffled rewards", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    plot = ROOT / "docs" / f"learning_band_{task}{suffix}.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot)
    plt.close(fig)
    _success_plot(rows, task, suffix)


def _success_plot(rows: list[dict[str, Any]], task: str, suffix: str = "") -> bool:
    """Held-out sampled success against RL step, each run a thin line (seeds blue, controls
    grey) and each arm's mean bold, into docs/learning_success_<task><suffix>.png; False
    (nothing drawn) when no run recorded its curve."""
    curves = [(r["control"], r["success_curve"]) for r in rows if r.get("success_curve")]
    if not curves:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for control, colour, label in ((False, "tab:blue", "RL"), (True, "tab:grey", "control")):
        arm = [c for ctl, c in curves if ctl == control]
        for c in arm:
            ax.plot(*zip(*c, strict=True), color=colour, alpha=0.35, lw=1)
        steps = sorted({x for c in arm for x, _ in c})
        means = [(x, statistics.fmean(y for c in arm for s, y in c if s == x)) for x in steps]
        if means:
            ax.plot(*zip(*means, strict=True), color=colour, lw=2.5, marker="o",
                    label=f"{label} mean, n={len(arm)}")  # fmt: skip
    ax.set_xlabel("RL step (0: untrained)")
    ax.set_ylabel("held-out success, sampled at T=1")
    ax.set_ylim(0, 1)
    ax.set_title(f"SmolLM2-135M, {task}: held-out success per step", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / f"learning_success_{task}{suffix}.png")
    plt.close(fig)
    return True


def _rise(r: dict[str, Any]) -> float:
    return float(r["sampled_after"] - r["sampled_before"])


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| run | sampled success before -> after | rise ± s.e. | greedy before -> after | format before -> after | wall | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        se = r.get("paired", {}).get("sampled", {}).get("se")
        lines.append(
            f"| {r['run']} | {r['sampled_before']:.2f} -> {r['sampled_after']:.2f} | "
            f"{_rise(r):+.2f}{f' ± {se:.2f}' if se is not None else ''} | "
            f"{r['greedy_before']:.2f} -> {r['greedy_after']:.2f} | "
            f"{r['format_before']:.2f} -> {r['format_after']:.2f} | "
            f"{r['wall_s'] / 60:.0f} min | {r['peak_rss_mib'] / 1024:.1f} GiB |"
        )
    means = {}
    for control in (False, True):
        rises = [_rise(r) for r in rows if r["control"] == control]
        if rises:
            means[control] = statistics.fmean(rises)
            sd = f" ± {statistics.stdev(rises):.2f} sd" if len(rises) > 1 else " (one run)"
            lines.append(
                f"| **{'control' if control else 'RL'} mean, {len(rises)} run(s)** | | "
                f"**{means[control]:+.2f}{sd}** | | | | |"
            )
    if len(means) == 2:
        lines.append(f"| **RL minus control** | | **{means[False] - means[True]:+.2f}** | | | | |")
    return "\n".join(lines)


def slice_table(rows: list[dict[str, Any]]) -> str:
    """Per run, the paired sampled success before -> after on each held-out slice (the
    scenarios' `metadata["slice"]`: a wording seen in training or not, one hop or two);
    empty when the task labels none."""
    labels = sorted({label for r in rows for label in r.get("slices", {})})
    if not labels:
        return ""
    lines = [
        "| run | "
        + " | ".join(f"{label}: sampled before -> after (rise)" for label in labels)
        + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for r in rows:
        cells = []
        for label in labels:
            p = r.get("slices", {}).get(label, {}).get("sampled")
            cells.append(
                f"{p['before']:.2f} -> {p['after']:.2f} ({p['rise']:+.2f}), n={int(p['n'])}"
                if p and "before" in p
                else "-"
            )
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(data: dict[str, Any], plot: bool = True) -> str:
    """The docs section of a task: what ran where, the table, the plot, and the held-out
    rollouts of the first seed before and after."""
    rows = data["rows"]
    seeds = [r["seed"] for r in rows if not r["control"]]
    controls = [r["seed"] for r in rows if r["control"]]
    head = (
        f"Seeds {', '.join(map(str, seeds)) or 'none'}; control runs (shuffled rewards) "
        f"{', '.join(map(str, controls)) or 'none yet'}. {data['machine']}; "
        "`art-mcp train` with the defaults"
        + (f" and `{' '.join(data['extra'])}`" if data.get("extra") else "")
        + ", one run at a time, no test or other benchmark beside it; code "
        + ", ".join(sorted({str(r.get("commit", "?")) for r in rows}))
        + ". "
        "Rises are paired per held-out scenario"
        + (
            f" ({rows[0]['evaluated']} scenarios x {rows[0]['samples']} samples at T=1)."
            if rows
            else "."
        )
    )
    parts = [head, "", table(rows)]
    if by_slice := slice_table(rows):
        parts += [
            "",
            "By held-out slice (RL's paired rise, from the evaluation before RL):",
            "",
            by_slice,
        ]
    if warm := warm_table(rows):
        parts += ["", warm]
    if plot:
        band = f"learning_band_{data['task']}{host_suffix(host_key(data['machine']))}.png"
        parts += ["", f"![train reward per step]({band})"]
        if any(r.get("success_curve") for r in rows):
            won = f"learning_success_{data['task']}{host_suffix(host_key(data['machine']))}.png"
            parts += ["", f"![held-out success per step, RL against the control]({won})"]
    first = next((r for r in rows if not r["control"] and r.get("examples")), None)
    if first:
        parts += ["", f"Held-out rollouts of {first['run']}, untrained -> after its last step:", ""]
        for ex in first["examples"][:3]:
            parts += [
                f"- *{ex['task']}*",
                f"  - before ({ex['before_reward']:.1f}): `{ex['before']}`",
                f"  - after ({ex['after_reward']:.1f}): `{ex['after']}`",
            ]
    return "\n".join(parts)


def warm_table(rows: list[dict[str, Any]]) -> str:
    """For warm-started runs: per run and slice, held-out sampled success untrained -> after
    the warm start -> after RL, and the calls per solved episode (of which repeated) before
    RL -> after; empty when no run warm-started."""
    if not any(r.get("warm_start") for r in rows):
        return ""
    labels = [k for k in rows[0]["warm_start"] if k != "all"] + ["all"]
    lines = [
        'The SFT warm start apart ("before" above is after it): held-out sampled success '
        "untrained -> after the warm start -> after RL, and calls per solved episode (repeated) "
        "before RL -> after:",
        "",
        "| run | "
        + " | ".join(f"{label}: success" for label in labels)
        + " | "
        + " | ".join(f"{label}: calls per solved" for label in labels)
        + " |",
        "|---|" + "---:|" * (2 * len(labels)),
    ]
    for r in rows:
        cells = []
        for label in labels:
            w = r["warm_start"].get(label, {}).get("sampled")
            a = (
                r["paired"]["sampled"]
                if label == "all"
                else r["slices"].get(label, {}).get("sampled")
            )
            cells.append(
                f"{w['before']:.2f} -> {w['after']:.2f} -> {a['after']:.2f}" if w and a else "-"
            )
        for label in labels:
            c = r.get("calls", {}).get(label)
            cells.append(
                f"{c['before']:.2f} ({c['repeated_before']:.2f}) -> {c['after']:.2f} "
                f"({c['repeated_after']:.2f})"
                if c
                else "-"
            )
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _warm_cells(rows: list[dict[str, Any]], label: str, kind: str) -> str:
    """Mean untrained | after the warm start | after RL | RL's rise (± sd over the runs) of
    a slice ("all": every evaluated scenario), for the warm-started table."""

    def got(r: dict[str, Any], part: str) -> dict[str, float]:
        if label == "all":
            return dict(r["warm_start"]["all"][kind]) if part == "warm" else r["paired"][kind]
        return dict(r["warm_start" if part == "warm" else "slices"][label][kind])

    warm = [got(r, "warm") for r in rows]
    rl = [got(r, "rl") for r in rows]
    rises = [x["rise"] for x in rl]
    sd = f" ± {statistics.stdev(rises):.2f} sd" if len(rises) > 1 else " (one run)"
    return (
        f"{statistics.fmean(x['before'] for x in warm):.2f} | "
        f"{statistics.fmean(x['before'] for x in rl):.2f} | "
        f"{statistics.fmean(x['after'] for x in rl):.2f} | "
        f"**{statistics.fmean(rises):+.2f}**{sd}"
    )


def warm_headline(datasets: list[dict[str, Any]]) -> list[str]:
    """The headline's table rows for warm-started runs: per host class and slice, held-out
    success untrained, after the warm start and after RL, with RL's paired rise (the
    warm start's own is the difference of the first two columns); seeds, then controls."""
    lines: list[str] = []
    for data in datasets:
        if host_key(data["machine"]) == "avx2cap":
            continue
        host = HOST_LABEL[host_key(data["machine"])]
        labels = ["two-hop", "all"] if "two-hop" in data["rows"][0]["slices"] else ["all"]
        for control in (False, True):
            rows = [r for r in data["rows"] if r["control"] == control]
            if not rows:
                lines.append(f"| {host} | control (shuffled rewards): no run yet | | | | |")
                continue
            arm = (
                f"control (shuffled rewards), {len(rows)} run(s)"
                if control
                else f"RL, {len(rows)} seed(s)"
            )
            for label in labels:
                for kind in ("sampled", "greedy") if not control else ("sampled",):
                    what = f"{label}, {'sampled at T=1' if kind == 'sampled' else kind}"
                    lines.append(f"| {host} | {what}, {arm} | {_warm_cells(rows, label, kind)} |")
    if not lines:
        return []
    steps = len(datasets[0]["rows"][0]["train_reward"])
    return [
        "| host | held-out success (never trained on) | untrained | after the warm start | "
        f"after {steps} RL steps | RL's rise |",
        "|---|---|---:|---:|---:|---:|",
        *lines,
    ]


def headline(datasets: list[dict[str, Any]]) -> str:
    """The README's first-screen lines: per host class, mean before -> after over the seeds
    and the control's rise, then each class's wall time, peak RSS and machine. A capped
    host ("avx2cap") stands in for a class, and is left to docs/results.md. Warm-started
    runs get their own table (`warm_headline`)."""
    lines: list[str] = []
    notes: list[str] = []
    warm = all(r.get("warm_start") for data in datasets for r in data["rows"])
    if warm and datasets:
        lines = warm_headline(datasets)
    for data in datasets:
        rl = [r for r in data["rows"] if not r["control"]]
        ctl = [r for r in data["rows"] if r["control"]]
        if not rl or host_key(data["machine"]) == "avx2cap":
            continue
        host = HOST_LABEL[host_key(data["machine"])]

        def mean(rows: list[dict[str, Any]], key: str) -> float:
            return statistics.fmean(float(r[key]) for r in rows)

        def spread(rows: list[dict[str, Any]]) -> str:
            rises = [_rise(r) for r in rows]
            return f" ± {statistics.stdev(rises):.2f} sd" if len(rises) > 1 else " (one run)"

        if not warm:
            if not lines:
                steps = len(rl[0]["train_reward"])
                lines = [
                    "| host | held-out success (never trained on) | untrained | "
                    f"after {steps} RL steps | rise |",
                    "|---|---|---:|---:|---:|",
                ]
            lines += [
                f"| {host} | sampled at T=1, RL, {len(rl)} seed(s) | {mean(rl, 'sampled_before'):.2f} | "
                f"{mean(rl, 'sampled_after'):.2f} | **{statistics.fmean(map(_rise, rl)):+.2f}**"
                f"{spread(rl)} |",
                f"| {host} | greedy, RL, {len(rl)} seed(s) | {mean(rl, 'greedy_before'):.2f} | "
                f"{mean(rl, 'greedy_after'):.2f} | "
                f"{mean(rl, 'greedy_after') - mean(rl, 'greedy_before'):+.2f} |",
            ]
            if ctl:
                lines.append(
                    f"| {host} | sampled at T=1, control (shuffled rewards), {len(ctl)} run(s) | "
                    f"{mean(ctl, 'sampled_before'):.2f} | {mean(ctl, 'sampled_after'):.2f} | "
                    f"{statistics.fmean(map(_rise, ctl)):+.2f}{spread(ctl)} |"
                )
            else:
                lines.append(f"| {host} | control (shuffled rewards) | no run yet | | |")
        walls = [round(r["wall_s"] / 60) for r in data["rows"]]
        took = f"{min(walls)}-{max(walls)}" if min(walls) != max(walls) else f"{walls[0]}"
        peak = max(r["peak_rss_mib"] for r in data["rows"]) / 1024
        notes.append(f"{host}: {took} min, peak RSS {peak:.1f} GiB ({data['machine']})")
    if not lines:
        return ""
    lines += [
        "",
        "One run, evaluations included: " + "; ".join(notes) + ". "
        "Per seed: [docs/results.md](docs/results.md).",
    ]
    return "\n".join(lines)


def pooled_rise(r: dict[str, Any]) -> float:
    """The paired rise in held-out success over the greedy and the sampled episodes pooled:
    with one sample per scenario, the mean of the greedy and the sampled rise."""
    p = r["paired"]
    return float(p["greedy"]["rise"] + p["sampled"]["rise"]) / 2


MARGIN_SDS = 2.33
"""A test of these runs' arguments requires the seeds' mean pooled rise minus this many
spreads (about 1 run in 100 of a normal spread falls below it): tests/test_demo.py's
MIN_RISE_*. The spread is the seeds' sd, or one run's evaluation noise where that is
larger (`pooled_se`): a few seeds that happen to agree must not make a margin tighter
than a single run can be measured (5 seeds at sd 0.06 set +0.28, and a CI run failed it
at +0.25, its own standard error 0.11)."""


def pooled_se(r: dict[str, Any]) -> float:
    """One run's standard error of its pooled rise, at its largest: the mean of the greedy
    and the sampled rise's (as if the two moved together per scenario)."""
    p = r["paired"]
    return float(p["greedy"]["se"] + p["sampled"]["se"]) / 2


def margin(rows: list[dict[str, Any]]) -> str:
    """What a test of these runs' arguments may require: the seeds' pooled rises (mean, sd,
    least, and mean - MARGIN_SDS spreads, the spread being the larger of the sd and the
    median run's `pooled_se`) against the controls'."""
    seeds = [r for r in rows if not r["control"]]
    rl = [pooled_rise(r) for r in seeds]
    ctl = [pooled_rise(r) for r in rows if r["control"]]
    if len(rl) < 2:
        return ""
    mean, sd = statistics.fmean(rl), statistics.stdev(rl)
    noise = statistics.median(pooled_se(r) for r in seeds)
    spread = max(sd, noise)
    which = "the sd" if sd >= noise else "a run's evaluation s.e., above the sd"
    return (
        f"Pooled paired rise (greedy and sampled episodes together), seeds: "
        f"{', '.join(f'{x:+.2f}' for x in rl)}; mean {mean:+.2f} ± {sd:.2f} sd, least "
        f"{min(rl):+.2f}; a run's evaluation s.e. {noise:.2f} (median); mean - {MARGIN_SDS} x "
        f"{spread:.2f} ({which}) {mean - MARGIN_SDS * spread:+.2f}. Controls: "
        f"{', '.join(f'{x:+.2f}' for x in ctl) or 'none'}."
    )


def combine(task: str, tag: str = "") -> list[dict[str, Any]]:
    """Every tagged result of a task, pooled per host class (`host_key`), one row per run
    name: seeds in order, then the controls. Without `tag`, the runs of the defaults
    (bench/results/learning/learning_<task>_*.json with no extra flags); with it, the runs tagged
    `<tag>_*`, which must share their flags. Within a class every run must come from one
    machine line and one commit."""
    parts: dict[str, list[dict[str, Any]]] = {}
    pattern = f"learning_{task}_{tag}_*.json" if tag else f"learning_{task}_*.json"
    for path in sorted(RESULTS.glob(pattern)):
        part = json.loads(path.read_text())
        if of_the_defaults(task, part.get("extra", [])) == bool(tag):
            continue  # a run with other flags is not a run of the defaults
        parts.setdefault(host_key(part["machine"]), []).append(part)
    datasets = []
    for host in sorted(parts):
        machines = {p["machine"] for p in parts[host]}
        extras = {tuple(p.get("extra", [])) for p in parts[host]}
        if len(machines) > 1:
            raise SystemExit(f"{host} results from more than one host: {sorted(machines)}")
        if len(extras) > 1:
            raise SystemExit(f"runs with different flags: {sorted(extras)}")
        rows = {r["run"]: r for p in parts[host] for r in p["rows"]}
        commits = sorted({str(r.get("commit")) for r in rows.values()})
        if len(commits) > 1:  # a run of the defaults of one commit never stands for another's
            raise SystemExit(
                f"{host} runs of different commits, never pooled: {commits}; move the older "
                "ones into a folder named after their commit (bench/results/learning/<commit>/)"
            )
        datasets.append(
            {
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": machines.pop(),
                "task": task,
                "args": parts[host][-1]["args"],
                "extra": list(extras.pop()),
                "rows": sorted(rows.values(), key=lambda r: (r["control"], r["seed"])),
            }
        )
    return datasets


def _compared(tag: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(task label, `tag`'s runs, the defaults' runs) for each task and host class that has
    both; the label names the class where `tag` ran on more than one."""
    out = []
    for task in ("capitals", "books"):
        tagged = {host_key(d["machine"]): d for d in combine(task, tag)}
        defaults = {host_key(d["machine"]): d for d in combine(task)}
        hosts = [h for h in sorted(tagged) if h in defaults]
        if not hosts:
            raise SystemExit(
                f"{task}: no host class has runs of both {tag} ({sorted(tagged) or 'none'}) and "
                f"the defaults ({sorted(defaults) or 'none'})"
            )
        for h in hosts:
            label = f"{task} ({h})" if len(tagged) > 1 else task
            out.append((label, tagged[h], defaults[h]))
    return out


def compare(tag: str) -> str:
    """Each run of the defaults beside the run of the same name tagged `tag` (flags of its
    own, on the same host class), for both tasks: sampled success before -> after, greedy
    and format after, wall time and peak RSS, then each arm's mean sampled rise."""
    head = [
        f"Each run of the defaults beside the same run with {tag}'s flags, both tasks; "
        "sampled success is paired per held-out scenario (24 x 2 samples at T=1).",
        "",
        f"| task, run | sampled, {tag} | sampled, defaults | greedy after, {tag} / defaults "
        f"| format after, {tag} / defaults | wall, {tag} / defaults | peak RSS, {tag} / defaults |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines, means = head, []
    for task, other, ours in _compared(tag):
        a, b = ({r["run"]: r for r in d["rows"]} for d in (other, ours))
        for run in [r["run"] for r in ours["rows"] if r["run"] in a]:
            x, y = a[run], b[run]

            def sampled(r: dict[str, Any]) -> str:
                rise = r["paired"]["sampled"]["rise"]
                return f"{r['sampled_before']:.2f} -> {r['sampled_after']:.2f} ({rise:+.2f})"

            lines.append(
                f"| {task}, {run} | {sampled(x)} | {sampled(y)} "
                f"| {x['greedy_after']:.2f} / {y['greedy_after']:.2f} "
                f"| {x['format_after']:.2f} / {y['format_after']:.2f} "
                f"| {x['wall_s'] / 60:.1f} / {y['wall_s'] / 60:.1f} min "
                f"| {x['peak_rss_mib'] / 1024:.1f} / {y['peak_rss_mib'] / 1024:.1f} GiB |"
            )
        for name, rows in ((tag, a), ("defaults", b)):
            for control in (False, True):
                rises = [
                    r["paired"]["sampled"]["rise"] for r in rows.values() if r["control"] == control
                ]
                if len(rises) > 1:
                    kind = "controls" if control else "seeds"
                    means.append(
                        f"{task}, {name}, {kind}: mean sampled rise {statistics.fmean(rises):+.2f} "
                        f"± {statistics.stdev(rises):.2f} sd, least {min(rises):+.2f}"
                    )
    return "\n".join([*lines, "", *(f"- {m}" for m in means)])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--task", choices=sorted(TASKS), default="capitals")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--controls", default="1,2,3")
    p.add_argument(
        "--extra",
        default="",
        help="more `art-mcp train` flags, as one string, after the task's evaluation flags (TASK_EVAL)",
    )
    p.add_argument("--tag", default="", help="a suffix for the results file")
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="a new folder for the runs' logs and models, kept (default: a temporary one)",
    )
    p.add_argument("--combine", action="store_true", help="gather the tagged results; run nothing")
    p.add_argument("--compare", default="", help="a tag to set beside the defaults; run nothing")
    p.add_argument(
        "--validation",
        action="store_true",
        help="run on the task's validation slice (a quarter of its training entities and "
        "wordings; never "
        "its held-out scenarios), for choosing a setting; needs --tag",
    )
    args = p.parse_args(argv)
    if args.validation and not args.tag:
        p.error("--validation needs --tag: a choice's runs never land among the results")
    os.chdir(ROOT)  # the tasks' paths (`task_args`) are the repository's
    # SIGTERM (`kill`) unwinds as Ctrl-C does, through `run_watched`'s stop of the run
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.compare:
        text = compare(args.compare)
        print(text)
        update_docs(f"learning_compare_{args.compare}", text)
        return
    if args.combine:
        datasets = combine(args.task, args.tag)
        for data in datasets:
            sfx = host_suffix(host_key(data["machine"]))
            name = f"learning_{args.task}{'_' + args.tag if args.tag else ''}{sfx}"
            write_results(RESULTS / f"{name}.json", data)
            if args.tag:  # runs with their own flags (the CI test's): no plot
                text = "\n".join([summary(data, plot=False), "", margin(data["rows"])])
            else:
                _band_plot(data["rows"], args.task, sfx)
                text = "\n".join([summary(data), "", margin(data["rows"])]).strip()
            print(text)
            update_docs(name, text)
        if not args.tag:
            update_docs(f"learning_headline_{args.task}", headline(datasets))
        return
    # the task's evaluation flags first, so an arm's --extra keeps them (a later flag wins)
    extra = [*TASK_EVAL.get(args.task, []), *args.extra.split()]
    plan = [(int(s), False) for s in args.seeds.split(",") if s]
    plan += [(int(s), True) for s in args.controls.split(",") if s]
    rows: list[dict[str, Any]] = []
    suffix = f"_{args.tag}" if args.tag else ""
    data = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, CPU flags: {cpu_flags()}",
        "task": args.task,
        "validation": args.validation,
        "args": task_args(args.task),
        "extra": extra,
        "rows": rows,
    }
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            if args.keep.exists() and any(args.keep.iterdir()):  # a run there would resume
                p.error(f"--keep {args.keep}: not empty; give a new folder")
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep.resolve())
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
        scenarios = validation_file(args.task, Path(tmp)) if args.validation else None
        for seed, control in plan:
            row = run_one(args.task, seed, control, extra, Path(tmp), scenarios=scenarios)
            print(
                f"{row['run']}: sampled {row['sampled_before']:.2f} -> {row['sampled_after']:.2f}, "
                f"greedy {row['greedy_before']:.2f} -> {row['greedy_after']:.2f}, "
                f"{row['wall_s'] / 60:.1f} min, {row['peak_rss_mib']:.0f} MiB",
                flush=True,
            )
            rows.append(row)
            # each run as it lands: a stop during the next run loses only that run
            write_results(RESULTS / f"learning_{args.task}{suffix}.json", data)
    if not args.tag and of_the_defaults(args.task, extra):  # a tagged part waits for --combine
        sfx = host_suffix(host_key(data["machine"]))
        _band_plot(rows, args.task, sfx)
        update_docs(f"learning_{args.task}{sfx}", summary(data))
    print(table(rows))


if __name__ == "__main__":
    main()
