"""The BFCL example's training mix, chosen on the validation slice: arms x seeds, side by side.

An arm is a `--train-categories` list (a category named twice gets twice the share of a
step's groups). Each run is `python -m examples.bfcl --eval-split validation` (the training
half's validation slice: never the held-out items the table reports) with the arm's list
and a seed, in a child process under the project's watchdog, one after another, arms
alternating within a seed. Runs land in `--out` as `<arm>-s<seed>/result.json`; one there
already with the code checked out now and the same flags is not run again
(`bench.learning_bfcl`'s rule). Then the
table: per arm, over its seeds, the mean greedy rise over the four calling categories
(mean ± sd over seeds) and irrelevance under "required" (with `decline`) before and after,
each seed's figures beside; saved to bench/results/bfcl_mix/bfcl_<host>_mix_<tag>.json.

    .venv/bin/python -m bench.bfcl_mix --arms all,half --seeds 1,2,3 --out runs/mix
    .venv/bin/python -m bench.bfcl_mix --arms all,half --seeds 1,2,3 --out runs/mix --combine
    .venv/bin/python -m bench.bfcl_mix --arms noparallel --steps 12 --eval-at 3,6,9 ...

`--steps`, `--eval-at` and `--eval-modes` go to every arm's run; a run's `--eval-at`
evaluations (the model as a run of that many steps would end) are rows of their own, so
one run per seed gives the curve of a choice of steps.

Arms: `calling` (the four calling categories), `all` (those and irrelevance in turn: 1
group in 5), `third` (irrelevance 2 groups in 6), `half` (1 group in 2), and `third-batch`
(`third` with `TrainConfig(flat_groups="batch_baseline")`), `third-batchpos` (with
`"batch_baseline_positive"`), `noparallel` (simple_python, multiple and irrelevance in
turn, 1 group in 3 each: the calling categories that need one call, without the parallel
ones, whose several calls pull the untrained model's count the other way),
`noparallel-once` (`noparallel` with `--decline-reward once`: an irrelevance pass by n
`decline` calls earns 1/n, not 1.0), `noparallel-tiebreak` (with `--decline-reward
tiebreak`: such a pass earns 0.9). Needs BFCL's
environment (scripts/setup-bfcl.sh). Left out: choosing for the user (the table shows the
trade; the docs say which arm was taken and why).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.learning import host_key, run_watched
from bench.learning_bfcl import _done
from bench.readme import results_dir, write_results
from examples.bfcl.splits import load_splits

RESULTS = results_dir("bfcl_mix")
_C = ("simple_python", "multiple", "parallel", "parallel_multiple")
_THIRD = (*_C[:2], "irrelevance", *_C[2:], "irrelevance")
"""The example's mix until `noparallel` was chosen over it: irrelevance 2 groups in 6."""
_NOPARALLEL = ("simple_python", "multiple", "irrelevance")
"""The calling categories that need one call, and irrelevance: 1 group in 3 each."""
ARMS = {
    "calling": _C,
    "all": (*_C, "irrelevance"),
    "third": _THIRD,
    "half": tuple(x for c in _C for x in (c, "irrelevance")),
    "third-batch": _THIRD,
    "third-batchpos": _THIRD,
    "noparallel": _NOPARALLEL,  # the example's TRAINED
    "noparallel-once": _NOPARALLEL,
    "noparallel-tiebreak": _NOPARALLEL,
}
"""Each arm's `--train-categories`."""
TRAIN_CONFIGS = {
    "third-batch": {"flat_groups": "batch_baseline"},
    "third-batchpos": {"flat_groups": "batch_baseline_positive"},
}
"""The arms that also change `TrainConfig` (`--train-config`): `third-batch` trains groups
of one reward against the step's mean, `third-batchpos` only those above it (`bench.rl_lr`'s
`batch` and `batchpos` arms, for the harness's tasks): a default changes on both sides of
issue 53's rule or on neither."""
EXAMPLE_FLAGS = {
    "noparallel-once": ["--decline-reward", "once"],
    "noparallel-tiebreak": ["--decline-reward", "tiebreak"],
}
"""The arms that change the example's own code (its reward), not the library's."""


def _setting(r: dict[str, Any]) -> str:
    """What runs of different arms must share to sit in one table: every argument but the
    arm's categories, the seed, the control flag and the folder."""
    skip = ("seed", "control", "out", "train_categories", "train_config", "decline_reward")
    return json.dumps({k: v for k, v in r["args"].items() if k not in skip}, sort_keys=True)


def run(arms: list[str], seeds: list[int], out: Path, extra: list[str] | None = None) -> None:
    """Each arm's run of each seed, with `extra` flags for the example (--steps, --eval-at,
    --eval-modes: the same for every arm)."""
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for arm in arms:
            cats = ",".join(ARMS[arm])
            folder = out / f"{arm}-s{seed}"
            flags = ["--eval-split", "validation", "--train-categories", cats, *(extra or [])]
            if arm in TRAIN_CONFIGS:
                flags += ["--train-config", json.dumps(TRAIN_CONFIGS[arm])]
            flags += EXAMPLE_FLAGS.get(arm, [])
            if _done(folder / "result.json", flags):
                print(f"{arm} s{seed}: landed already with this code")
                continue
            cmd = [sys.executable, "-m", "examples.bfcl", "--seed", str(seed), *flags]
            cmd += ["--out", str(folder)]
            rc, _ = run_watched(f"{arm}-s{seed}", cmd, out / f"{arm}-s{seed}.log")
            if rc != 0:
                raise RuntimeError(f"{arm} s{seed} failed ({rc}); see {out}/{arm}-s{seed}.log")
            r = json.loads((folder / "result.json").read_text())
            print(f"{arm} s{seed}: calling rise {r['calling_mean_greedy_rise']:+.3f}", flush=True)


def combine(arms: list[str], seeds: list[int], out: Path, tag: str, results: Path = RESULTS) -> str:
    """The table of the runs in `out` (refused when they ran different code, or arguments
    beyond arm and seed), saved to `results`/bfcl_<host>_mix_<tag>.json."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for arm in arms:
        for seed in seeds:
            path = out / f"{arm}-s{seed}" / "result.json"
            if path.exists():
                runs.setdefault(arm, []).append(json.loads(path.read_text()))
    every = [r for rs in runs.values() for r in rs]
    if not every:
        raise SystemExit(f"no runs in {out}")
    codes = {r["code"] for r in every}
    if len(codes) > 1:
        raise SystemExit(f"runs of different code, never pooled: {sorted(codes)}")
    if len({_setting(r) for r in every}) > 1:
        raise SystemExit("runs of different arguments (beyond the arm and seed), never pooled")
    host = host_key(every[0]["cpu_flags"])
    sizes = {c: len(ids) for c, ids in load_splits()["validation"].items()}
    steps = every[0]["args"]["steps"]
    lines = [
        f"BFCL validation slice ({'/'.join(str(sizes[c]) for c in _C)} calling items, "
        f"{sizes['irrelevance']} irrelevance), {steps} steps, code "
        f"{every[0]['code']} (commits {', '.join(sorted({r['commit'] for r in every}))}); "
        f"host CPU flags {every[0]['cpu_flags']}, {every[0].get('allocator', '-')}",
        "",
        "| arm | seeds | calling rise (mean ± sd) | irrelevance, required | each seed: rise, "
        "irrelevance after | wall min |",
        "|---|---|---:|---:|---|---:|",
    ]
    for arm, rs in runs.items():
        # a run's --eval-at evaluations first (as runs of that many steps would end), then its end
        for at in [*every[0]["args"].get("eval_at", []), steps]:
            stage = [r if at == steps else r["at_steps"][str(at)] for r in rs]
            rises = [x["calling_mean_greedy_rise"] for x in stage]
            irr = [x["accuracy"]["irrelevance/greedy"] for x in stage]
            sd = f" ± {statistics.stdev(rises):.2f}" if len(rises) > 1 else ""
            each = "; ".join(
                f"s{r['args']['seed']}: {x:+.2f}, {i['after']:.2f}"
                for r, x, i in zip(rs, rises, irr, strict=True)
            )
            wall = statistics.fmean(r["wall_s"] for r in rs) / 60 if at == steps else None
            lines.append(
                f"| {arm}{'' if at == steps else f', after {at} steps'} | {len(rs)} | "
                f"{statistics.fmean(rises):+.2f}{sd} | "
                f"{statistics.fmean(i['before'] for i in irr):.2f} -> "
                f"{statistics.fmean(i['after'] for i in irr):.2f} | {each} | "
                f"{'-' if wall is None else f'{wall:.1f}'} |"
            )
    text = "\n".join(lines)
    write_results(
        results / f"bfcl_{host}_mix_{tag}.json",
        {
            "about": "examples/bfcl's training mix on the validation slice "
            "(bench.bfcl_mix); for a choice, never reported as a BFCL result",
            "table": text,
            "arms": {
                a: {
                    "train_categories": list(ARMS[a]),
                    "train_config": TRAIN_CONFIGS.get(a, {}),
                    "example_flags": EXAMPLE_FLAGS.get(a, []),
                }
                for a in runs
            },
            "runs": {
                a: [{k: r[k] for k in r if k != "per_item"} for r in rs] for a, rs in runs.items()
            },
        },
    )
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arms", default="all,half", help=f"of {', '.join(ARMS)}")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--out", type=Path, required=True, help="where the runs land")
    p.add_argument("--tag", default="validation", help="names the results file")
    p.add_argument("--combine", action="store_true", help="only pool the runs in --out")
    p.add_argument(
        "--steps", type=int, default=None, help="every arm's --steps (default: the example's)"
    )
    p.add_argument("--eval-at", default="", help="every arm's --eval-at: steps also evaluated")
    p.add_argument(
        "--eval-modes", default="", help="every arm's --eval-modes (default: the example's)"
    )
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        p.error(f"unknown arms {sorted(unknown)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    if not args.combine:
        extra = [] if args.steps is None else ["--steps", str(args.steps)]
        extra += ["--eval-at", args.eval_at] if args.eval_at else []
        extra += ["--eval-modes", args.eval_modes] if args.eval_modes else []
        run(arms, seeds, args.out, extra)
    print(combine(arms, seeds, args.out, args.tag))


if __name__ == "__main__":
    main()
