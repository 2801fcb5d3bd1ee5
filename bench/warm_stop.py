"""How many epochs the SFT warm start needs, per task, and the loss at which it may stop.

`art-mcp train` warm-starts on a task's demonstrations before RL (`HarnessConfig.sft_epochs`:
three epochs); `--sft-stop-loss` ends it after the first epoch whose last quarter of
batches has a mean token loss at or under a value (the first epoch's measured before each
batch trains on it: demonstrations not yet seen). What value may it be? Each arm here
warm-starts the defaults for 1, 2 or 3 epochs on a task's validation slice
(`bench.learning.validation_file`: training entities only) and stops before RL
(`--steps 0`, no untrained evaluation), so its one evaluation is held-out success after
that many epochs; the warm start's own record (history.jsonl) gives each epoch's tail
loss and its seconds. The tasks are the bundled ones that ship demonstrations (capitals:
every scenario; the two-hop org chart: 64). For each candidate stop loss the table then
says, per task, the epoch the rule would stop at, the success there against three epochs',
and the warm-start time it saves.

    .venv/bin/python -m bench.warm_stop --out runs/warm_stop [--tasks capitals,org] [--seed 1]
        [--epochs 1,2,3] [--compute-dtype float32|bfloat16]
    .venv/bin/python -m bench.warm_stop --out runs/warm_stop --combine

`--compute-dtype` runs the warm start's matmuls in that dtype (`--compute-dtype` of
`art-mcp train`; the engine that evaluates keeps its own): an arm of its own, named with
a `-bf16` or `-fp32` suffix, tabulated beside the default's rows.

Each run lands in `--out` as `<task>-e<epochs>-s<seed>[-<dtype>].json` and is not run again;
`--combine` tabulates them into bench/results/warm_stop/warm_stop_<host>.json and the docs
(docs/benchmarks.md#warm-stop). Left out: RL after the warm start (bench.time_to_rise
times whole runs), and other learning rates (bench.warm_start chose 3e-3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from art_langgraph.backend.checkpoints import CheckpointFolder
from art_langgraph.training.sft import FIRST_STOP_EPOCH
from bench.learning import TASK_EVAL, host_key, run_one, validation_file
from bench.readme import results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("capitals", "org")
"""The bundled tasks whose scenarios carry demonstrations."""
EPOCHS = (1, 2, 3)
"""The arms' epochs: up to `DEFAULT_SFT_EPOCHS`."""
CANDIDATES = (0.005, 0.01, 0.02, 0.05, 0.1)
"""Stop losses the table tries (nats per trained token)."""


DTYPE_SUFFIX = {"float32": "fp32", "bfloat16": "bf16"}
"""The run-name suffix of an arm with `--compute-dtype`."""


def flags(task: str, epochs: int, dtype: str | None = None) -> list[str]:
    """An arm's `art-mcp train` flags beside the task's: the warm start alone for all its
    epochs (no stop loss), evaluated as the task's runs of the defaults are, its matmuls in
    `dtype` (None: the default's)."""
    ev = TASK_EVAL.get(task, [])
    scen = ev[ev.index("--eval-scenarios") : ev.index("--eval-scenarios") + 2] if ev else []
    extra = ["--compute-dtype", dtype] if dtype else []
    return [
        *["--steps", "0", "--sft-epochs", str(epochs), "--sft-stop-loss", "0"],
        *["--eval-untrained", "false", *scen, *extra],
    ]


def warm_record(folder: Path, name: str) -> dict[str, float]:
    """The warm start's metrics as the backend recorded them (its history line)."""
    model = CheckpointFolder(folder / "mcp" / "models" / name)
    (rec,) = [h for h in model.history() if "sft_steps" in h]
    return {k: float(v) for k, v in rec.items() if k.startswith("sft_")}


def run_all(
    out: Path, tasks: list[str], seed: int, epochs_of: tuple[int, ...], dtype: str | None
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    suffix = f"-{DTYPE_SUFFIX[dtype]}" if dtype else ""
    for task in tasks:
        for epochs in epochs_of:
            name = f"{task}-e{epochs}-s{seed}{suffix}"
            dest = out / f"{name}.json"
            if dest.exists():
                print(f"{dest.name}: landed already", flush=True)
                continue
            scen = validation_file(task, out)
            arm = flags(task, epochs, dtype)
            row = run_one(task, seed, False, arm, out, name=name, scenarios=scen)
            row.update(task=task, epochs=epochs, flags=arm, cpu_flags=cpu_flags(), dtype=dtype)
            row["sft"] = warm_record(out, name)
            write_results(dest, row)
            print(f"{name}: {line(row)}", flush=True)


def line(row: dict[str, Any]) -> str:
    tails = ", ".join(f"{t:.3f}" for t in tails_of(row))
    return (
        f"held-out sampled {row['sampled_before']:.2f}, greedy {row['greedy_before']:.2f}; "
        f"tail losses {tails}; {row['sft']['sft_seconds']:.0f} s"
    )


def tails_of(row: dict[str, Any]) -> list[float]:
    sft = row["sft"]
    return [sft[f"sft_epoch{k}_tail_loss"] for k in range(1, int(sft["sft_epochs"]) + 1)]


def stop_epoch(tails: list[float], loss: float) -> int:
    """The epoch `--sft-stop-loss loss` ends the warm start after (1-based), given each
    epoch's tail loss: the first from `FIRST_STOP_EPOCH` on at or under it; the last when
    none is."""
    at = (k for k, t in enumerate(tails, 1) if k >= FIRST_STOP_EPOCH and t <= loss)
    return next(at, len(tails))


def label(row: dict[str, Any]) -> str:
    """A row's arm: its task, and the warm start's matmul dtype where an arm chose one."""
    dtype = row.get("dtype")
    return f"{row['task']} ({DTYPE_SUFFIX[dtype]})" if dtype else row["task"]


def _each(values: list[float]) -> str:
    """The mean, with each seed's value after it when there are several."""
    mean = f"{statistics.mean(values):.2f}"
    return mean if len(values) == 1 else f"{mean} ({', '.join(f'{v:.2f}' for v in values)})"


def table(rows: list[dict[str, Any]]) -> str:
    """Per arm and epochs: held-out success after the warm start (mean, then each seed's),
    each epoch's tail loss and tail share of demonstrations with no token in doubt (seed by
    seed, `;` between seeds) and the warm start's seconds; then per stop loss and arm the
    epoch it stops at (each seed), the success there and at the most epochs run, and the
    time it saves."""
    by: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((label(r), r["epochs"]), {})[r.get("seed", 0)] = r
    lines = [
        "| arm | epochs | held-out sampled | held-out greedy | tail loss, each epoch | "
        "tail share with no token in doubt, each epoch | warm start s |",
        "|---|---:|---:|---:|---|---|---:|",
    ]
    for (arm, e), seeds in sorted(by.items()):
        runs = [seeds[k] for k in sorted(seeds)]
        tails = "; ".join(", ".join(f"{t:.3f}" for t in tails_of(r)) for r in runs)
        sure = "; ".join(
            ", ".join(
                "-" if (x := r["sft"].get(f"sft_epoch{k}_tail_sure")) is None else f"{x:.2f}"
                for k in range(1, e + 1)
            )
            for r in runs
        )
        lines.append(
            f"| {arm} | {e} | {_each([r['sampled_before'] for r in runs])} | "
            f"{_each([r['greedy_before'] for r in runs])} | {tails} | {sure} | "
            f"{statistics.mean(r['sft']['sft_seconds'] for r in runs):.0f} |"
        )
    arms = sorted({a for a, _ in by})
    most = {a: max(e for b, e in by if b == a) for a in arms}
    lines += [
        "",
        "| stop loss | "
        + " | ".join(f"{a}: epochs, sampled (the most epochs'), time saved" for a in arms)
        + " |",
        "|---:|" + "---|" * len(arms),
    ]
    for loss in CANDIDATES:
        cells = []
        for a in arms:
            full = by[(a, most[a])]
            ks, at, ref, saved = [], [], [], []
            for seed, r in sorted(full.items()):
                k = stop_epoch(tails_of(r), loss)
                ks.append(str(k))
                run = by.get((a, k), {}).get(seed)
                ref.append(r["sampled_before"])
                if run is not None:  # that many epochs were run for this seed
                    at.append(run["sampled_before"])
                    saved.append(1 - run["sft"]["sft_seconds"] / r["sft"]["sft_seconds"])
            sampled = f"{statistics.mean(at):.2f}" if len(at) == len(ks) else "-"
            cut = f"{statistics.mean(saved):.0%}" if len(at) == len(ks) else "-"
            cells.append(f"{', '.join(ks)}, {sampled} ({statistics.mean(ref):.2f}), {cut}")
        lines.append(f"| {loss:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def combine(out: Path) -> str:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*-e[0-9]-s[0-9]*.json"))]
    if not rows:
        raise SystemExit(f"no runs in {out}")
    commits = sorted({r["commit"] for r in rows})
    hosts = {host_key(r["cpu_flags"]) for r in rows}
    if len(commits) > 1 or len(hosts) > 1:
        raise SystemExit(f"runs of different commits or hosts, never pooled: {commits} {hosts}")
    host = hosts.pop()
    seeds = sorted({r["seed"] for r in rows})
    text = (
        f"The SFT warm start alone, 1-3 epochs, on each task's validation slice (held-out "
        f"success after it: greedy and 2 samples at T=1); seed {', '.join(map(str, seeds))}; "
        f"commit {commits[0]}; host {host} (CPU flags: {rows[0]['cpu_flags']}).\n\n" + table(rows)
    )
    write_results(
        results_dir("warm_stop") / f"warm_stop_{host}.json", {"table": text, "runs": rows}
    )
    update_docs("warm_stop", text)
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", default=",".join(map(str, EPOCHS)), help="the arms' epochs")
    p.add_argument("--compute-dtype", choices=sorted(DTYPE_SUFFIX), default=None)
    p.add_argument("--out", type=Path, required=True, help="the runs' folder (kept)")
    p.add_argument("--combine", action="store_true", help="tabulate the runs in --out")
    args = p.parse_args(argv)
    tasks = args.tasks.split(",")
    if unknown := set(tasks) - set(TASKS):
        p.error(f"no demonstrations in task {sorted(unknown)}")
    if args.combine:
        print(combine(args.out))
        return
    out = args.out.resolve()
    os.chdir(ROOT)  # the task's server is a module of this repository
    epochs = tuple(int(e) for e in args.epochs.split(","))
    run_all(out, tasks, args.seed, epochs, args.compute_dtype)


if __name__ == "__main__":
    sys.exit(main())
