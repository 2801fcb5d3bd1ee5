"""The sweep that chose `art-mcp train`'s defaults for real models: one seed per setting.

Each setting is one `art-mcp train` run on the bundled capital/currency task
(`bench.learning`'s `capitals`) with seed 0, the library's defaults and one or two flags
changed; the seeds' runs (seeds 1-5) and the book-facts task come after the defaults are
frozen, in `bench.learning`. A setting's figure is its paired rise in held-out success,
sampled at temperature 1 and greedy, from the untrained model to the last step.

    .venv/bin/python -m bench.defaults_sweep [--only lr1e-4,lr3e-4] [--steps N]

Rows are added to bench/results/defaults_sweep/defaults_sweep.json as each run ends (a cut
sweep keeps what finished; a setting run again replaces its row; each row records the commit
its run started on, the file that of the last sweep), and the table goes to docs/benchmarks.md.

Left out: more than one seed per setting (a sweep picks; the seeds then measure), and a
grid over every field (the fields swept are named in the table; the rest keep the values
their documentation gives).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

from bench.learning import run_one, task_args
from bench.readme import results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
RESULTS = results_dir("defaults_sweep") / "defaults_sweep.json"
SETTINGS: dict[str, list[str]] = {
    "lr1e-4": ["--learning-rate", "1e-4"],
    "lr3e-4": ["--learning-rate", "3e-4"],
    "lr1e-3": ["--learning-rate", "1e-3"],
    "lr3e-3": ["--learning-rate", "3e-3"],
    # the rollouts' temperature at the frozen learning rate; held-out sampling stays at 1
    "t0.7": ["--temperature", "0.7"],
    "t1.0": ["--temperature", "1.0"],
    "t1.3": ["--temperature", "1.3"],
}
"""Setting name -> the flags it changes from the defaults."""


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| setting | flags | sampled success before -> after | rise | greedy before -> after "
        "| rise | train reward first -> last step | wall | peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rewards = [x for x in r["train_reward"] if x is not None]
        first_last = f"{rewards[0]:.2f} -> {rewards[-1]:.2f}" if rewards else "-"
        lines.append(
            f"| {r['run']} | `{' '.join(r['flags'])}` | {r['sampled_before']:.2f} -> "
            f"{r['sampled_after']:.2f} | {r['sampled_after'] - r['sampled_before']:+.2f} | "
            f"{r['greedy_before']:.2f} -> {r['greedy_after']:.2f} | "
            f"{r['greedy_after'] - r['greedy_before']:+.2f} | {first_last} | "
            f"{r['wall_s'] / 60:.0f} min | {r['peak_rss_mib'] / 1024:.1f} GiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    p.add_argument("--extra", default="", help="flags added to every setting, as one string")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SETTINGS)
    data: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": []}
    for name in names:
        flags = SETTINGS[name] + args.extra.split()
        with tempfile.TemporaryDirectory() as tmp:
            row = run_one("capitals", 0, False, flags, Path(tmp), name=name)
        row["flags"] = flags
        print(
            f"{name}: sampled {row['sampled_before']:.2f} -> {row['sampled_after']:.2f}, greedy "
            f"{row['greedy_before']:.2f} -> {row['greedy_after']:.2f}, "
            f"{row['wall_s'] / 60:.1f} min",
            flush=True,
        )
        data["rows"] = [r for r in data["rows"] if r["run"] != name] + [row]
        for key in ("commit", "dirty"):  # the file's stamp is this sweep's (write_results);
            data.pop(key, None)  # each row keeps the commit its run read at its start
        data.update(
            date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            machine=f"{platform.machine()}, {os.cpu_count()} cores, CPU flags: {cpu_flags()}",
            task=task_args("capitals"),
        )
        write_results(RESULTS, data)
        update_docs("defaults_sweep", table(data["rows"]))
    print(table(data["rows"]))


if __name__ == "__main__":
    main()
