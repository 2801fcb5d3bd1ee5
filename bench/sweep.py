"""Arms of `art-mcp train` flags on tasks' validation slices: what a sweep that chooses a
harness default runs.

An arm is a list of flags; every other flag stays at its default. `run_all` trains each
(seed, task, arm) not landed yet on the task's validation slice
(`bench.learning.validation_file`: a quarter of its training entities held out, and of
their wordings where the scenarios name them; its own
held-out scenarios never seen), one after another under the project's watchdog, arms
alternating within a task; a run lands in the sweep's folder as
`<task>-<arm>-s<seed>.json` (its figures and commit). `table` pools the seeds per task and
arm; `combine` saves the table of a folder's runs under bench/results/<sweep>/ (and into the
docs, where they have the sweep's markers), refusing runs of different commits or host
classes. `main` is a sweep's command line.

Left out: which arm to choose (the benchmark that calls this says, in its docs section),
and BFCL (its graph is the user's own, so the harness's settings never run there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from bench.learning import TASK_EVAL, host_key, run_one, validation_file
from bench.readme import results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("capitals", "directory", "org")
"""One lookup with recall possible (capitals), one lookup without (the staff directory),
and one or two dependent lookups (the org chart)."""


def run_path(out: Path, task: str, arm: str, seed: int) -> Path:
    return out / f"{task}-{arm}-s{seed}.json"


def run_all(out: Path, tasks: list[str], arms: dict[str, list[str]], seeds: list[int]) -> None:
    """Every (seed, task, arm) run not landed yet, arms alternating within a task; a task
    with its own evaluation flags (`bench.learning.TASK_EVAL`: the org chart's 48 scenarios,
    evaluated every 3 steps) gets them in every arm, and no arm evaluates the untrained
    model (`--eval-untrained false`: the table's rises start before RL)."""
    out.mkdir(parents=True, exist_ok=True)
    slices = {task: validation_file(task, out) for task in tasks}  # one per task, every seed's
    for seed in seeds:
        for task in tasks:
            for arm, flags in arms.items():
                dest = run_path(out, task, arm, seed)
                if dest.exists():
                    print(f"{dest.name}: landed already", flush=True)
                    continue
                name = f"{task}-{arm}-s{seed}"
                # what is measured (never the untrained model: the table's rises are RL's,
                # and the arms would repeat one evaluation), then the arm
                extra = [*TASK_EVAL.get(task, []), "--eval-untrained", "false", *flags]
                row = run_one(task, seed, False, extra, out, name=name, scenarios=slices[task])
                row.update(task=task, arm=arm, flags=flags, cpu_flags=cpu_flags())
                write_results(dest, row)
                print(
                    f"{name}: sampled {row['sampled_before']:.2f} -> {row['sampled_after']:.2f}, "
                    f"{row['wall_s'] / 60:.1f} min",
                    flush=True,
                )


def table(rows: list[dict[str, Any]]) -> str:
    """Per task and arm: the seeds' mean sampled rise (± sd), each seed's on the one-hop and
    two-hop questions where the task has them, success after, the groups
    the trainer took (those without one reward for all rollouts) of those rolled out over
    the run, repeated calls per solved held-out episode before and after RL, and wall time."""
    lines = [
        "| task | arm | seeds | sampled rise (mean ± sd) | one-hop sampled rise "
        "| two-hop sampled rise | sampled after | greedy after | groups trained / rolled out "
        "| repeated calls per solved episode | wall min |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for task in dict.fromkeys(r["task"] for r in rows):
        for arm in dict.fromkeys(r["arm"] for r in rows if r["task"] == task):
            rs = [r for r in rows if r["task"] == task and r["arm"] == arm]
            rises = [r["sampled_after"] - r["sampled_before"] for r in rs]
            sd = f" ± {statistics.stdev(rises):.2f}" if len(rises) > 1 else ""
            lines.append(
                f"| {task} | {arm} | {len(rs)} | {statistics.fmean(rises):+.2f}{sd} | "
                f"{_slice(rs, 'one-hop')} | {_slice(rs, 'two-hop')} | {statistics.fmean(r['sampled_after'] for r in rs):.2f} | "
                f"{statistics.fmean(r['greedy_after'] for r in rs):.2f} | {_trained(rs)} | "
                f"{_repeats(rs)} | {_wall(rs)} |"
            )
    return "\n".join(lines)


def _wall(rows: list[dict[str, Any]]) -> str:
    """The seeds' mean wall time in minutes; "-" where a run was stopped before its end."""
    walls = [r.get("wall_s") for r in rows]
    return "-" if None in walls else f"{statistics.fmean(walls) / 60:.1f}"  # type: ignore[arg-type]


def _repeats(rows: list[dict[str, Any]]) -> str:
    """Repeated calls per solved held-out episode, before RL -> after, the seeds' mean; "-"
    for runs that did not record their calls."""
    calls = [(r.get("calls") or {}).get("all") for r in rows]
    if None in calls:
        return "-"
    before = [c["repeated_before"] for c in calls]  # type: ignore[index]
    after = [c["repeated_after"] for c in calls]  # type: ignore[index]
    if None in before or None in after:  # a run with no solved episode at one end
        return "-"
    return f"{statistics.fmean(before):.2f} -> {statistics.fmean(after):.2f}"


def _slice(rows: list[dict[str, Any]], name: str) -> str:
    """The seeds' sampled rises on one slice of the questions ("one-hop", "two-hop"; paired,
    from the evaluation before RL), each run's; "-" for a task without that slice."""
    rises = [r.get("slices", {}).get(name, {}).get("sampled", {}).get("rise") for r in rows]
    if None in rises:
        return "-"
    return ", ".join(f"{x:+.2f}" for x in rises)


def _trained(rows: list[dict[str, Any]]) -> str:
    """Groups trained on / rolled out over a run, the seeds' mean; "-" for runs that did not
    record their groups."""
    pairs = []
    for r in rows:
        groups, flat = r.get("groups") or [], r.get("zero_variance_groups") or []
        if not groups or len(groups) != len(flat) or None in groups or None in flat:
            return "-"
        pairs.append((sum(groups) - sum(flat), sum(groups)))
    return (
        f"{statistics.fmean(t for t, _ in pairs):.0f} / {statistics.fmean(g for _, g in pairs):.0f}"
    )


def combine(out: Path, sweep: str, title: str, tag: str) -> str:
    """The table of every run in `out`, headed by `title`, saved to
    bench/results/<sweep>/<sweep>_<host>[_tag].json; refused when the runs' commits or host
    classes differ."""
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*-s[0-9]*.json"))]
    if not rows:
        raise SystemExit(f"no runs in {out}")
    commits = sorted({r.get("commit", "?") for r in rows})
    if len(commits) > 1:
        raise SystemExit(f"runs of different commits, never pooled: {commits}")
    hosts = {host_key(r["cpu_flags"]) for r in rows}
    if len(hosts) > 1:
        raise SystemExit(f"runs of different host classes, never pooled: {sorted(hosts)}")
    text = (
        f"{title} on each task's validation slice; commit {commits[0]}; host "
        f"{hosts.pop()} (CPU flags: {rows[0]['cpu_flags']}); `art-mcp train` defaults but "
        "the arm's flags.\n\n" + table(rows)
    )
    name = f"{sweep}_{host_key(rows[0]['cpu_flags'])}{'_' + tag if tag else ''}"
    write_results(results_dir(sweep) / f"{name}.json", {"table": text, "runs": rows})
    update_docs(f"{sweep}{'_' + tag if tag else ''}", text)  # where the docs have its markers
    return text


def main(
    argv: list[str] | None, doc: str, arms: dict[str, list[str]], sweep: str, title: str
) -> None:
    """A sweep's command line: run its arms (`--arms`, `--tasks`, `--seeds`) into `--out`,
    or tabulate what landed there (`--combine`)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--arms", default=",".join(arms))
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--out", type=Path, required=True, help="the runs' folder (kept)")
    p.add_argument("--tag", default="")
    p.add_argument("--combine", action="store_true", help="tabulate the runs in --out")
    args = p.parse_args(argv)
    chosen, tasks = args.arms.split(","), args.tasks.split(",")
    if unknown := (set(chosen) - set(arms)) | (set(tasks) - set(TASKS)):
        p.error(f"unknown arm or task: {sorted(unknown)}")
    if args.combine:
        print(combine(args.out, sweep, title, args.tag))
        return
    out = args.out.resolve()
    os.chdir(ROOT)  # the tasks' servers are modules of this repository
    run_all(out, tasks, {a: arms[a] for a in chosen}, [int(s) for s in args.seeds.split(",") if s])
