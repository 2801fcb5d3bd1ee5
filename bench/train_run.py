"""A whole real-model `art-mcp train` run from two checkouts, side by side: step time and peak RSS.

Runs the main job as a user would (`python -m art_mcp.cli train` over the bundled MCP
server and its scenarios, the real preset, `auto` dtypes, forced tool calls, no warm
start), once from this checkout and once from `--ref` (another checkout of the project,
e.g. an older commit made with `git worktree add`), one after the other, each in its own
process tree, nothing else running. Each run: an evaluation of the untrained model,
`--steps` GRPO steps of `--groups` groups x `--group-size` rollouts of up to
`--max-turns` turns, an evaluation after. Reported per run:

- each step's rollout seconds and training seconds (from the job's own log lines) and
  the rest of the step (the adapter swap and saving, from the step's history record);
- the whole run's wall time, and its peak RSS (the largest process of the tree: the job,
  which holds the engine and the trainer: `getrusage`'s maximum resident size of the
  children of a small wrapper process, one wrapper per run).

    .venv/bin/python -m bench.train_run --ref ../ref-bbcd9a3 [--steps 2]

Both checkouts run under this checkout's virtual environment (`sys.executable`), so
the comparison is of the code alone. Left out: vLLM (bench.agent_rollouts compares
engines), learning (bench.learning).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.readme import ROOT, results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("train_run") / "train_run.json"
_PEAK = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
    "print(f'MAXRSS_KB={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', "
    "file=sys.stderr); sys.exit(rc)"
)
"""Runs a command and prints its peak RSS (its largest process, as `time -f %M` would)."""


def _run(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-c", _PEAK, sys.executable, "-m", "art_mcp.cli", "train",
            "--server", f"{sys.executable} -m examples.mcp_server.server",
            "--scenarios", "examples/mcp_server/scenarios.jsonl",
            "--reward", "examples.mcp_server.tasks:score",
            "--tool-choice", "required",
            "--base-model", args.base_model,
            "--sft-epochs", "0",
            "--steps", str(args.steps),
            "--groups-per-step", str(args.groups),
            "--group-size", str(args.group_size),
            "--max-turns", str(args.max_turns),
            "--eval-samples", "0",
            "--eval-scenarios", str(args.eval_scenarios),
            "--path", tmp,
            "--name", "bench",
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise SystemExit(
                f"{checkout}: art-mcp train failed ({proc.returncode}):\n{out[-4000:]}"
            )
        history = [
            json.loads(line)
            for line in (Path(tmp) / "mcp/models/bench/history.jsonl").read_text().splitlines()
        ]
    rollouts = [float(x) for x in re.findall(r"RL step \d+: \d+ of \d+ rollouts.* in (\d+) s", out)]
    trains = [float(x) for x in re.findall(r"RL step \d+: trained .* in (\d+) s", out)]
    steps = [h for h in history if "step_seconds" in h]
    rest = [h["step_seconds"] - h.get("train_seconds", 0.0) for h in steps]
    peak = re.findall(r"MAXRSS_KB=(\d+)", out)
    commit = subprocess.run(
        ["git", "log", "-1", "--format=%h"], cwd=checkout, capture_output=True, text=True
    ).stdout.strip()
    return {
        "checkout": str(checkout),
        "commit": commit,
        "wall_s": wall,
        "rollout_s": rollouts,
        "train_s": trains,
        "swap_and_save_s": rest,
        "step_s": [r + t for r, t in zip(rollouts, trains, strict=False)],
        "train_tokens_per_s": [h.get("train_tokens_per_s") for h in steps],
        "peak_rss_mib": int(peak[-1]) / 1024 if peak else None,
        "rewards": [h.get("reward") for h in steps],
    }


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", type=Path, help="another checkout to run side by side")
    p.add_argument("--base-model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--eval-scenarios", type=int, default=8)
    args = p.parse_args()
    rows = []
    for checkout in ([args.ref.resolve()] if args.ref else []) + [ROOT]:
        print(f"running {checkout} ...", flush=True)
        rows.append(_run(checkout, args))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    lines = [
        f"{args.base_model}, `auto` dtypes, {args.groups} groups x {args.group_size} rollouts, "
        f"up to {args.max_turns} turns, forced tool calls, {args.steps} steps, evaluation on "
        f"{args.eval_scenarios} held-out scenarios before and after; 2 cores "
        f"({platform.machine()}, CPU flags: {cpu_flags()}); both checkouts under one venv, "
        "one after the other\n",
        "| checkout | rollouts / step (s) | training / step (s) | swap + save / step (s) | "
        "step (s) | step vs first row | trainer tok/s | whole run (s) | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        step = _mean(r["step_s"])
        tps = _mean([x for x in r["train_tokens_per_s"] if x])
        lines.append(
            f"| {r['commit']} | {_mean(r['rollout_s']):.0f} | {_mean(r['train_s']):.0f} | "
            f"{_mean(r['swap_and_save_s']):.1f} | {step:.0f} | "
            f"{step / _mean(base['step_s']):.2f}x | {tps:.0f} | {r['wall_s']:.0f} | "
            f"{r['peak_rss_mib']:.0f} |"
        )
    table = "\n".join(lines)
    print(table)
    write_results(
        RESULTS,
        {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "host": {"cpu_flags": cpu_flags(), "machine": platform.machine()},
            "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows,
            "table": table,
        },
    )
    update_docs("train_run", table)


if __name__ == "__main__":
    main()
