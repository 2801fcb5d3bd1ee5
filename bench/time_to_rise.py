"""Minutes to a held-out rise: a cold `art-mcp train` of the defaults, from two checkouts, seed by seed.

Issue 55's metric: the wall time of a cold run (a fresh `--path`, nothing cached) from its
start to its last evaluation, counting the untrained evaluation, the warm start, the steps
and the evaluations; set-up is not counted (both checkouts run under this checkout's
virtual environment, already made). The command is the user's: `art-mcp train --server …
--scenarios … --reward …` of a bundled task, `--seed` and `--path` aside every flag at its
default, run from each checkout's own folder (its own code and task files; the task files
must be the same bytes in both, or the bench stops).

For each seed the reference checkout (`--ref`, e.g. main as it stood when the work began,
made with `git worktree add`) and this one run one after the other, the order alternating
seed by seed, each alone. Each run's JSON lands in `--out` as it ends (a rerun skips what
is there), with its wall time, its peak RSS (the run's process tree), where the time went
(from the run's own lines: the untrained evaluation, the other evaluations, the steps'
rollouts and training, and the rest: start-up, the warm start, swaps and saves), and its
held-out rises: untrained -> last and before RL -> last, paired, sampled. `--combine`
pools them: per checkout the mean wall time and rises, and per seed our wall over the
reference's; a faster run holds the rise when our mean untrained -> last rise is at most
0.05 below the reference's. Without `--ref` only this checkout runs: where a task's time
goes, without a ratio.

    .venv/bin/python -m bench.time_to_rise --ref ../base --seeds 1,2,3 --out runs/ttr
    .venv/bin/python -m bench.time_to_rise --ref ../base --out runs/ttr --combine

Left out: vLLM (the embedded default only) and the BFCL example (its own lines:
`examples.bfcl`'s result.json times its phases).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from art_mcp.evaluation import Evaluation, paired_rise
from bench.learning import TASKS, host_key, run_watched, task_args
from bench.readme import ROOT, results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("time_to_rise")
HELD = 0.05
"""How far our mean untrained -> last rise may sit below the reference's (issue 55)."""
PHASES = ("untrained_eval_s", "evals_s", "warm_start_s", "rollouts_s", "training_s", "other_s")
"""A run's phases, in seconds (`phases`): together its wall time."""
_CD = 'cd "$1" && shift && exec "$@"'
"""Runs the rest of its arguments from the folder given first: the checkout's own code."""


def _git(checkout: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, text=True
    ).stdout.strip()


def stamp(checkout: Path) -> str:
    """The checkout's short HEAD, with "+dirty" when tracked files differ from it."""
    head = _git(checkout, "rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if _git(checkout, "status", "--porcelain", "-uno") else "")


def task_digest(checkout: Path, task: str) -> str:
    """A hash of the task's files in `checkout` (its folder: server, scenarios, reward)."""
    folder = checkout / TASKS[task][1]
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


_EVAL = re.compile(r"^(.*held-out evaluation[^:]*): (\d+) episodes in (\d+) s", re.M)
_ROLLOUTS = re.compile(r"^RL step \d+: \d+ of \d+ rollouts.*? in (\d+) s", re.M)
_TRAINED = re.compile(r"^RL step \d+: trained .* in (\d+) s", re.M)
_WARM = re.compile(r"^SFT warm start on \d+ demonstrations: .*? in (\d+) s", re.M)
"""The warm start's line (one per epoch where a probe ends it); code before its time was
logged leaves it in `other_s`."""
_PROBE = re.compile(r"^warm-start probe after epoch \d+: .*? in (\d+) s", re.M)
"""A warm-start probe's line: counted in the warm start."""


def phases(log: str, wall_s: float) -> dict[str, float]:
    """Where a run's wall time went, from its own lines: the untrained evaluation, the
    other evaluations, the SFT warm start, the steps' rollouts and training, and the rest
    (start-up, swaps, saves: whatever no line times); with how many evaluations and steps
    the lines showed."""
    evals = [(label, float(s)) for label, _, s in _EVAL.findall(log)]
    rollouts, trained = _ROLLOUTS.findall(log), _TRAINED.findall(log)
    out = {
        "untrained_eval_s": sum(s for label, s in evals if "untrained" in label),
        "evals_s": sum(s for label, s in evals if "untrained" not in label),
        "warm_start_s": sum(float(s) for s in _WARM.findall(log) + _PROBE.findall(log)),
        "rollouts_s": sum(float(s) for s in rollouts),
        "training_s": sum(float(s) for s in trained),
    }
    out["other_s"] = wall_s - sum(out.values())
    return {**out, "evaluations": float(len(evals)), "steps": float(len(rollouts))}


def rises(report: dict[str, Any]) -> dict[str, float | None]:
    """The run's paired sampled rises: untrained -> last and before RL -> last."""
    evs = [Evaluation.model_validate(e) for e in report["evaluations"]]
    untrained = next((e for e in evs if e.step == 0), None)
    before, last = [e for e in evs if e.rl_step == 0][-1], evs[-1]
    return {
        "untrained_sampled": untrained.sampled_success if untrained else None,
        "before_rl_sampled": before.sampled_success,
        "last_sampled": last.sampled_success,
        "rise": paired_rise(untrained, last)["rise"] if untrained else None,
        "rl_rise": paired_rise(before, last)["rise"],
    }


def grpo_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's rows of RL steps (those that recorded their groups)."""
    return [r for r in report.get("rows", []) if "groups" in r and "zero_variance_groups" in r]


def run_one(
    checkout: Path, label: str, task: str, seed: int, out: Path, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One cold run of the defaults from `checkout`; its record (also saved in `out`).
    `extra`: flags after the task's (none in a measurement; a test's tiny model)."""
    name = f"{label}-s{seed}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="ttr-") as tmp:
        cmd = ["/bin/sh", "-c", _CD, "sh", str(checkout), sys.executable, "-m", "art_mcp.cli"]
        cmd += [
            "train",
            *task_args(task),
            "--seed",
            str(seed),
            "--path",
            tmp,
            "--name",
            name,
            *extra,
        ]
        log = out / f"{name}.log"
        t0 = time.perf_counter()
        rc, peak = run_watched(name, cmd, log, env=env)
        wall = time.perf_counter() - t0
        text = log.read_text()
        if rc != 0:
            raise SystemExit(f"{name} failed ({rc}):\n{text[-3000:]}")
        report = json.loads((Path(tmp) / "mcp/models" / name / "report.json").read_text())
    row = {
        "run": name,
        "label": label,
        "checkout": str(checkout),
        "commit": stamp(checkout),
        "task": task,
        "task_files": task_digest(checkout, task),
        "seed": seed,
        "cpu_flags": cpu_flags(),
        "started": time.time() - wall,
        "wall_s": wall,
        "peak_rss_mib": peak,
        "phases": phases(text, wall),
        **rises(report),
        # each RL step's flat groups and groups, for bench.flat_stop's replay
        "zero_variance_groups": [r["zero_variance_groups"] for r in grpo_rows(report)],
        "groups": [r["groups"] for r in grpo_rows(report)],
    }
    write_results(out / f"{name}.json", row)
    return row


def _ratio_cell(ratios: list[float]) -> str:
    """Our wall over the reference's, mean and per seed; "-" without a reference run."""
    if not ratios:
        return "-"
    return f"{_mean(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _mean_cell(xs: list[float | None]) -> str:
    """The mean of the values there are, 2 decimals; "-" for none."""
    have = [x for x in xs if x is not None]
    return f"{_mean(have):.2f}" if have else "-"


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs)


def run_order(rows: list[dict[str, Any]]) -> str:
    """How the pooled runs were ordered, from their start times: alternating, or the runs
    in the order they ran (a pool of runs made apart, `--combine`); runs recorded before
    start times were kept say so."""
    if any("started" not in r for r in rows):
        return "the order not recorded"
    ran = sorted(rows, key=lambda r: r["started"])
    labels = [r["label"] for r in ran]
    if len(set(labels)) < 2:
        return "one checkout's runs"
    if all(a != b for a, b in itertools.pairwise(labels)):
        return "the order alternating seed by seed"
    pairs = [ran[i : i + 2] for i in range(0, len(ran), 2)]
    # the bench's own schedule: each seed's runs back to back, the first checkout swapping
    # seed by seed (ours, ref; ref, ours; ...), so neither always runs second
    paired = all(
        len(p) == 2 and p[0]["seed"] == p[1]["seed"] and p[0]["label"] != p[1]["label"]
        for p in pairs
    )
    if paired and all(a[0]["label"] != b[0]["label"] for a, b in itertools.pairwise(pairs)):
        return "the order alternating seed by seed"
    return "not alternating: " + ", ".join(r["run"] for r in ran)


def table(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The pooled table (per checkout, the reference's row first) and its verdict."""
    labels = sorted({r["label"] for r in rows}, key=lambda x: x != "ref")
    by = {lab: {r["seed"]: r for r in rows if r["label"] == lab} for lab in labels}
    t = rows[0]
    head = (
        f"`art-mcp train` of the defaults on the {t['task']} task (task files {t['task_files']}), "
        f"cold, seeds {', '.join(str(s) for s in sorted({r['seed'] for r in rows}))}; "
        f"{host_key('CPU flags: ' + t['cpu_flags'])} host (CPU flags: {t['cpu_flags']}); each run "
        f"alone, both checkouts under one venv, {run_order(rows)}"
    )
    lines = [
        head,
        "",
        "| checkout | runs | wall min (each) | vs ref (per seed) | untrained eval | other evals "
        "| warm start | rollouts | training | rest | sampled untrained -> last "
        "| rise untrained -> last (each) | RL rise | peak RSS GiB |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    verdict: dict[str, Any] = {}
    for lab in labels:
        rs = [by[lab][s] for s in sorted(by[lab])]
        walls = [r["wall_s"] / 60 for r in rs]
        ph = {k: _mean([r["phases"].get(k, 0.0) for r in rs]) / 60 for k in PHASES}
        paired = [s for s in by[lab] if "ref" in by and s in by["ref"]]
        ratios = [by[lab][s]["wall_s"] / by["ref"][s]["wall_s"] for s in paired]
        up = [r["rise"] for r in rs if r["rise"] is not None]
        lines.append(
            f"| {lab} {', '.join(sorted({r['commit'] for r in rs}))} | {len(rs)} "
            f"| {_mean(walls):.1f} ({', '.join(f'{w:.1f}' for w in walls)}) "
            f"| {_ratio_cell(ratios)} "
            f"| {ph['untrained_eval_s']:.1f} | {ph['evals_s']:.1f} | {ph['warm_start_s']:.1f} "
            f"| {ph['rollouts_s']:.1f} "
            f"| {ph['training_s']:.1f} | {ph['other_s']:.1f} "
            f"| {_mean_cell([r.get('untrained_sampled') for r in rs])} -> "
            f"{_mean_cell([r.get('last_sampled') for r in rs])} "
            f"| {_mean(up):+.2f}{f' ± {_sd(up):.2f}' if len(up) > 1 else ''} "
            f"({', '.join(f'{x:+.2f}' for x in up)}) "
            f"| {_mean([r['rl_rise'] for r in rs]):+.2f} "
            f"| {max(r['peak_rss_mib'] for r in rs) / 1024:.2f} |"
        )
        verdict[lab] = {"wall_ratio": _mean(ratios), "rise": _mean(up), "seeds": sorted(by[lab])}
    lines.append("")
    lines.append(
        "Phases in minutes, means over the runs; `rest` is start-up, swaps and saves, and the "
        "warm start where the code did not log its time (0.0 in `warm start`)."
    )
    if "ref" in verdict and len(verdict) > 1:
        (ours,) = [v for k, v in verdict.items() if k != "ref"]
        held = ours["rise"] >= verdict["ref"]["rise"] - HELD
        verdict["held"] = held
        lines.append(
            f"Rise held (ours at most {HELD} below the reference's): {'yes' if held else 'no'}."
        )
    return "\n".join(lines), verdict


def combine(out: Path, tag: str) -> str:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*-s*.json"))]
    if not rows:
        raise SystemExit(f"no runs in {out}")
    if len({r["task_files"] for r in rows}) > 1:
        raise SystemExit("the runs' task files differ: they measured different tasks")
    text, verdict = table(rows)
    host = host_key("CPU flags: " + rows[0]["cpu_flags"])
    name = f"time_to_rise_{host}_{rows[0]['task']}" + (f"_{tag}" if tag else "")
    write_results(RESULTS / f"{name}.json", {"table": text, "verdict": verdict, "runs": rows})
    update_docs(f"time_to_rise_{rows[0]['task']}" + (f"_{tag}" if tag else ""), text)
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", type=Path, help="the reference checkout; none: this one alone")
    p.add_argument("--task", default="capitals", choices=sorted(TASKS))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--out", type=Path, required=True, help="the runs' folder (kept)")
    p.add_argument("--tag", default="", help="names the pooled results file")
    p.add_argument("--combine", action="store_true", help="only pool the runs in --out")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.combine:
        checkouts = {"ours": ROOT}
        if args.ref is not None:
            checkouts["ref"] = args.ref.resolve()
            mine, theirs = task_digest(ROOT, args.task), task_digest(checkouts["ref"], args.task)
            if mine != theirs:
                raise SystemExit(f"the task's files differ ({mine} here, {theirs} in --ref)")
        for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
            order = sorted(checkouts, reverse=i % 2 == 1)  # ours, ref; then ref, ours
            for label in order:
                if (args.out / f"{label}-s{seed}.json").exists():
                    continue
                print(f"{label} seed {seed} ({checkouts[label]}) ...", flush=True)
                r = run_one(checkouts[label], label, args.task, seed, args.out)
                print(f"  {r['wall_s'] / 60:.1f} min, rise {r['rise']}", flush=True)
    print(combine(args.out, args.tag))


if __name__ == "__main__":
    main()
