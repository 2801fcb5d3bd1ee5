"""What ending RL after K flat steps in a row would have cost the runs on record.

A flat step is an RL step whose every group (refills included) gave all its rollouts one
reward: GRPO has no signal, the step trains on nothing, and the adapter is unchanged, so
the next step samples the same policy on other scenarios. `art-mcp train
--stop-when-flat K` ends RL after K such steps in a row (then evaluates). This replays
that rule over every run in bench/results/ that recorded its steps' flat-group counts
(`zero_variance_groups`, with `groups` where recorded, else 8 a step): for each K, the
runs it would have ended, the steps it would have skipped, and the signal in them (groups
with more than one reward, which those steps did train on). No model runs: it reads the
records, so it measures nothing about time; a run's time per step is in its own record.

    .venv/bin/python -m bench.flat_stop

Left out: runs that did not record per-step counts (the time_to_rise runs' logs say it in
words), and what a skipped step's training would have changed (its signal is the proxy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.readme import results_dir, update_docs, write_results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = results_dir("flat_stop")
"""bench/results/flat_stop/: flat_stop.json, the replay's table and its rows."""
KS = (1, 2, 3)
"""The run lengths of flat steps replayed."""
GROUPS = 8
"""A step's groups where a record does not say (`groups_per_step`'s default)."""


def stop_after(flat: list[bool], k: int) -> int | None:
    """The step (1-based) after which the rule ends RL, or None when it never fires before
    the last step (ending after the last step skips nothing)."""
    run = 0
    for i, f in enumerate(flat, 1):
        run = run + 1 if f else 0
        if run == k and i < len(flat):
            return i
    return None


def runs_on_record(root: Path) -> list[dict[str, Any]]:
    """Every recorded run with per-step flat-group counts, once (pooled tables repeat
    their runs' rows): its file, name, task, the counts and the groups a step."""
    seen, out = set(), []
    for f in sorted(root.rglob("*.json")):
        if "flat_stop" in f.parts:
            continue
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        rows = data.get("rows") or data.get("runs") if isinstance(data, dict) else None
        for r in rows if isinstance(rows, list) else [data]:
            zv = r.get("zero_variance_groups") if isinstance(r, dict) else None
            if not zv:
                continue
            groups = r.get("groups") or [GROUPS] * len(zv)
            task = r.get("task") or data.get("task")
            task = task if isinstance(task, str) else f.stem
            key = json.dumps([task, r.get("run"), zv, groups], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            rel = f.relative_to(root).as_posix()
            out.append({"file": rel, "run": r.get("run"), "task": task, "zv": zv, "groups": groups})
    return out


def replay(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per K: the runs the rule ends early, the steps skipped, and the groups with signal
    in those steps."""
    rows = []
    for k in KS:
        fired, skipped, signal = [], 0, 0
        for r in runs:
            flat = [z >= g for z, g in zip(r["zv"], r["groups"], strict=True)]
            at = stop_after(flat, k)
            if at is None:
                continue
            lost = sum(int(g - z) for z, g in zip(r["zv"][at:], r["groups"][at:], strict=True))
            fired.append({"file": r["file"], "run": r["run"], "after_step": at, "signal": lost})
            skipped += len(flat) - at
            signal += lost
        steps = sum(len(r["zv"]) for r in runs)
        rows.append(
            {"k": k, "runs": len(runs), "steps": steps, "ended": len(fired),
             "skipped_steps": skipped, "signal_groups_skipped": signal, "fired": fired}
        )  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| K (flat steps in a row) | runs on record | their steps | runs ended early | "
        "steps skipped | groups with signal in them |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['k']} | {r['runs']} | {r['steps']} | {r['ended']} | {r['skipped_steps']} "
            f"| {r['signal_groups_skipped']} |"
        )
    return "\n".join(lines)


def main() -> None:
    runs = runs_on_record(ROOT / "bench" / "results")
    rows = replay(runs)
    flat = sum(z >= g for r in runs for z, g in zip(r["zv"], r["groups"], strict=True))
    text = table(rows)
    tasks = sorted({str(r["task"]) for r in runs})
    head = (
        f"Ending RL after K flat steps in a row, replayed over {len(runs)} recorded runs "
        f"(tasks and files: {', '.join(tasks)}; {flat} flat steps among their {sum(len(r['zv']) for r in runs)})"
    )
    print(head + "\n\n" + text)
    write_results(RESULTS / "flat_stop.json", {"table": head + "\n\n" + text, "rows": rows})
    update_docs("flat_stop", head + "\n\n" + text)


if __name__ == "__main__":
    main()
