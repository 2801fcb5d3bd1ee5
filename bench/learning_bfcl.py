"""Does RL make the real model better on BFCL? `python -m examples.bfcl` over seeds and controls.

Each run is the example as a user runs it (its defaults, plus `--seed`; `--control` for the
shuffled-reward arm), in a child process under the project's watchdog, one after another.
Its `result.json` (BFCL's pass/fail per held-out item, greedy and sampled, before and after;
the phases' wall time; its commit, code hash and arguments) is copied to
bench/results/learning_bfcl/bfcl_<host>_<run>.json as it lands, so a session's end loses at
most the run under way; a run already there with the code checked out now and the same flags
is not run again. Seeds and controls alternate. `--combine` pools this host class's runs,
which must be of the same code and arguments (it refuses a mix), into
bench/results/learning_bfcl/bfcl_<host>.json and prints the table: per category, the seeds'
mean before, after and rise with the seeds' spread, and the controls' rise. Runs of older
code the docs still cite are kept in its superseded/ folder, pooled with nothing.

    .venv/bin/python -m bench.learning_bfcl --seeds 0,1,2,3,4 --controls 1,2
    .venv/bin/python -m bench.learning_bfcl --combine
    .venv/bin/python -m bench.learning_bfcl --whole DIR    # a run kept with --keep DIR/..

`--whole` scores a kept run's untrained and trained model on BFCL's whole non-live
categories (`examples.bfcl.whole`), keeps it as bfcl_whole_<host>_<run>.json and puts its
tables, beside the public leaderboard's small models (`examples.bfcl.leaderboard`), into
docs/bfcl.md (`--publish-whole FILE` does that again from a saved file).

Needs BFCL's environment (scripts/setup-bfcl.sh). Left out: a whole evaluation per seed
(it takes hours on 2 cores: one seed's model is scored, once per table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.learning import MARGIN_SDS, host_key, run_watched
from bench.readme import results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags
from examples.bfcl import leaderboard
from examples.bfcl.app import CALLING, parser
from examples.bfcl.record import code_hash
from examples.bfcl.splits import EVAL_PER_CATEGORY
from examples.bfcl.whole import render

ROOT = Path(__file__).resolve().parent.parent
RESULTS = results_dir("learning_bfcl")
"""bench/results/learning_bfcl/: every run's JSON (bfcl_<host>_<run>.json) and the pooled tables."""


def _pooled(r: dict[str, Any]) -> tuple[str, str]:
    """What runs must share to be pooled: the code (the trees `examples.bfcl.record.CODE_PATHS`
    hash; the commit for runs made before it was recorded) and every argument but seed,
    arm, folder."""
    args = {k: v for k, v in r["args"].items() if k not in ("seed", "control", "out")}
    return r.get("code") or r["commit"], json.dumps(args, sort_keys=True)


def _done(path: Path, extra: list[str]) -> bool:
    """A run already landed in `path` with the code checked out now and the same flags."""
    if not path.exists():
        return False
    code = code_hash()
    args = vars(parser().parse_args(extra))
    return not code.endswith("+dirty") and _pooled(json.loads(path.read_text())) == _pooled(
        {"code": code, "args": args}
    )


def _prefix(host: str, tag: str) -> str:
    """Result files of host class `host`: bfcl_<host>_<run>.json, or with a tag (the CI
    arm's runs, made with its flags) bfcl_<host>_<tag>_<run>.json."""
    return f"bfcl_{host}_{tag}_" if tag else f"bfcl_{host}_"


def run_one(
    seed: int,
    control: bool,
    extra: list[str],
    folder: Path,
    host: str,
    tag: str = "",
    keep: bool = False,
) -> Path:
    name = f"{'control' if control else 'seed'}{seed}"
    dest = RESULTS / f"{_prefix(host, tag)}{name}.json"
    if _done(dest, extra) and not keep:  # --keep asks for the model: it runs again
        print(f"{name}: landed already with this code and these flags ({dest.name})")
        return dest
    out = folder / name
    cmd = [sys.executable, "-m", "examples.bfcl", "--seed", str(seed), "--out", str(out), *extra]
    if control:
        cmd.append("--control")
    rc, peak = run_watched(name, cmd, folder / f"{name}.log")
    if rc != 0:
        raise RuntimeError(f"{name} failed ({rc}):\n{(folder / f'{name}.log').read_text()[-3000:]}")
    result = json.loads((out / "result.json").read_text())
    result["tree_peak_rss_mib"] = round(peak)
    result["control"] = control
    if host_key(result["cpu_flags"]) != host:
        raise RuntimeError(f"{name} ran on {result['cpu_flags']}, not on host class {host}")
    write_results(dest, result)
    print(f"{name}: calling mean greedy rise {result['calling_mean_greedy_rise']:+.3f} -> {dest}")
    return dest


def combine(host: str, tag: str = "") -> str:
    """The table of host class `host`'s runs (of `tag`); refused when they ran different
    code or args."""
    prefix = _prefix(host, tag)
    runs = [
        json.loads(p.read_text())
        for kind in ("seed", "control")
        for p in sorted(RESULTS.glob(f"{prefix}{kind}[0-9]*.json"))
    ]
    if not runs:
        raise SystemExit(f"no {RESULTS / prefix}seed*.json yet")
    if len(kinds := {_pooled(r) for r in runs}) > 1:
        raise SystemExit(
            f"bfcl_{host}_*.json hold runs of different code or arguments, never pooled: "
            f"{sorted(kinds)}; re-run them on one commit"
        )
    seeds = [r for r in runs if not r["control"]]
    controls = [r for r in runs if r["control"]]
    lines = [
        f"BFCL held-out sample, {len(seeds)} seed(s) and {len(controls)} control(s); code "
        f"{runs[0].get('code', '-')} (commits {', '.join(sorted({r['commit'] for r in runs}))}), "
        f"flags {_pooled(runs[0])[1]}; host {host} (CPU flags: {runs[0]['cpu_flags']}), "
        f"malloc {', '.join(sorted({r.get('allocator', 'glibc') for r in runs}))}",
        "",
        "| category | untrained | after | rise (seeds' mean ± sd) | controls' rise |",
        "|---|---:|---:|---:|---:|",
    ]
    for cat in runs[0]["accuracy"]:

        def col(rs: list[dict[str, Any]], field: str, cat: str = cat) -> list[float]:
            return [r["accuracy"][cat][field] for r in rs]

        # untrained and after: the seeds' (the controls' while no seed has landed)
        arm = seeds or controls
        rises = col(seeds, "rise")
        sd = f" ± {statistics.stdev(rises):.2f}" if len(rises) > 1 else ""
        rise = f"{statistics.fmean(rises):+.2f}{sd}" if seeds else "-"
        ctrl = f"{statistics.fmean(col(controls, 'rise')):+.2f}" if controls else "-"
        lines.append(
            f"| {cat} | {statistics.fmean(col(arm, 'before')):.2f} | "
            f"{statistics.fmean(col(arm, 'after')):.2f} | {rise} | {ctrl} |"
        )
    walls = [r["wall_s"] / 60 for r in runs]
    rss = [r["peak_rss_gib"] for r in runs]
    lines += [
        "",
        f"One run: {min(walls):.0f}-{max(walls):.0f} min, peak RSS {max(rss):.1f} GiB. "
        "Per run, the mean greedy rise over the calling categories: "
        + (", ".join(f"{r['calling_mean_greedy_rise']:+.2f}" for r in seeds) or "no seed yet")
        + (
            " (seeds); "
            + ", ".join(f"{r['calling_mean_greedy_rise']:+.2f}" for r in controls)
            + " (controls)"
            if controls
            else ""
        ),
    ]
    failed = sum(
        len(v)
        for r in runs
        for errors in r.get("failed_requests", {}).values()
        for v in errors.values()
    )
    if failed:
        lines.append(
            f"{failed} evaluation requests failed across the runs, counted as failed items."
        )
    if len(seeds) > 1:
        lines.append(margin(seeds, controls))
    text = "\n".join(lines)
    write_results(
        RESULTS / f"{prefix.rstrip('_')}.json", {"table": text, "runs": [r["args"] for r in runs]}
    )
    if not tag:  # the table's runs (the CI arm's, tagged, live in their own docs section)
        update_docs("bfcl_table", text, ROOT / "docs" / "bfcl.md")
        if seeds:  # the README's rows claim nothing before a seed has landed
            update_docs("bfcl_headline", headline(host, seeds, controls))
    return text


def _calling_mean(run: dict[str, Any], field: str) -> float:
    return statistics.fmean(run["accuracy"][f"{c}/greedy"][field] for c in CALLING)


def headline(host: str, seeds: list[dict[str, Any]], controls: list[dict[str, Any]]) -> str:
    """The README's rows: the calling categories' greedy mean and irrelevance (under the
    training's "required", and under "auto" where evaluated), untrained and after, over the seeds (mean, and the rise's sd) and the controls, with a run's time,
    memory and the host's flags."""

    def row(label: str, runs: list[dict[str, Any]], mean: Any) -> str:
        rises = [mean(r, "rise") for r in runs]
        spread = f" ± {statistics.stdev(rises):.2f} sd" if len(rises) > 1 else " (one run)"
        return (
            f"| {label}, {len(runs)} run(s) | {statistics.fmean(mean(r, 'before') for r in runs):.2f} | "
            f"{statistics.fmean(mean(r, 'after') for r in runs):.2f} | "
            f"**{statistics.fmean(rises):+.2f}**{spread} |"
        )

    def irrelevance(r: dict[str, Any], field: str) -> float:
        return float(r["accuracy"]["irrelevance/greedy"][field])

    def irrelevance_auto(r: dict[str, Any], field: str) -> float:
        return float(r["accuracy"]["irrelevance/greedy_auto"][field])

    args = (seeds + controls)[0]["args"]
    items = args.get("eval_limit") or EVAL_PER_CATEGORY
    lines = [
        f"| BFCL, held-out functions ({items} items a category), greedy | untrained | "
        f"after {args['steps']} RL steps | rise |",
        "|---|---:|---:|---:|",
        row("4 calling categories' mean, RL", seeds, _calling_mean),
    ]
    if controls:
        lines.append(
            row("4 calling categories' mean, control (shuffled rewards)", controls, _calling_mean)
        )
    lines.append(
        row('irrelevance under "required" (declining is the pass), RL', seeds, irrelevance)
    )
    if all("irrelevance/greedy_auto" in r["accuracy"] for r in seeds):
        lines.append(
            row('irrelevance under "auto" (no call is the pass), RL', seeds, irrelevance_auto)
        )
    runs = seeds + controls
    walls = [r["wall_s"] / 60 for r in runs]
    per_seed = ", ".join(f"{r['calling_mean_greedy_rise']:+.2f}" for r in seeds)
    lines += [
        "",
        f"Per seed: {per_seed}. One run, "
        f"evaluations included: {min(walls):.0f}-{max(walls):.0f} min, peak RSS "
        f"{max(r['peak_rss_gib'] for r in runs):.1f} GiB ({host}: x86_64, 2 cores, CPU flags "
        f"{runs[0]['cpu_flags']}; code {runs[0].get('code', '-')}). Per category, the sampled "
        "figures and the runs: [docs/bfcl.md](docs/bfcl.md).",
    ]
    return "\n".join(lines)


def margin(seeds: list[dict[str, Any]], controls: list[dict[str, Any]]) -> str:
    """What a test of these runs' arguments may require of its headline (the mean greedy rise
    over the calling categories evaluated): the seeds' mean minus MARGIN_SDS spreads, the
    spread being the larger of the seeds' sd and the median run's own s.e."""
    rises = [r["calling_mean_greedy_rise"] for r in seeds]
    mean, sd = statistics.fmean(rises), statistics.stdev(rises)
    noise = statistics.median(r["calling_mean_greedy_se"] for r in seeds)
    spread = max(sd, noise)
    ctl = ", ".join(f"{r['calling_mean_greedy_rise']:+.2f}" for r in controls) or "none"
    return (
        f"Headline rise, seeds {', '.join(f'{x:+.2f}' for x in rises)}: mean {mean:+.2f} ± "
        f"{sd:.2f} sd, a run's s.e. {noise:.2f} (median); mean - {MARGIN_SDS} x {spread:.2f} = "
        f"{mean - MARGIN_SDS * spread:+.2f}. Controls: {ctl}."
    )


def _order(seeds: str, controls: str) -> list[tuple[int, bool]]:
    """Seeds and controls alternated, so a session that ends early holds both arms."""
    arms = [
        [(int(x), False) for x in seeds.split(",") if x],
        [(int(x), True) for x in controls.split(",") if x],
    ]
    order = []
    while any(arms):
        for arm in arms:
            if arm:
                order.append(arm.pop(0))
    return order


def run_whole(run: Path, host: str) -> Path:
    """BFCL's whole non-live categories for a run kept in `run` (`examples.bfcl.whole`),
    kept in bench/results/learning_bfcl/bfcl_whole_<host>_<run's folder name>.json."""
    name = f"whole_{run.name}"
    cmd = [sys.executable, "-m", "examples.bfcl.whole", "--run", str(run)]
    rc, peak = run_watched(name, cmd, run / "whole.log")
    if rc != 0:
        raise RuntimeError(f"{name} failed ({rc}):\n{(run / 'whole.log').read_text()[-3000:]}")
    result = json.loads((run / "whole.json").read_text())
    result["tree_peak_rss_mib"] = round(peak)
    dest = RESULTS / f"bfcl_whole_{host}_{run.name}.json"
    write_results(dest, result)
    publish_whole(dest)
    return dest


def publish_whole(path: Path) -> str:
    """A whole evaluation's tables (per category; then beside the leaderboard's small models)
    with the run it scored, into docs/bfcl.md's `bfcl_whole` block; returns the text."""
    r = json.loads(path.read_text())
    if r["args"].get("limit") is not None:
        raise SystemExit(f"{path.name} scored the first {r['args']['limit']} items a category only")
    run = r["run"]
    text = "\n".join(
        [
            f"BFCL's whole non-live categories, greedy, `{path.name}`: commit {r['commit']}, code "
            f"{r['code']}; the run scored: commit {run['commit']}, code {run.get('code')}, "
            f"seed {run['args']['seed']}, {run['args']['steps']} steps, trained on "
            f"{run['args']['train_categories']}; CPU flags {r['cpu_flags']}, "
            f"{r['wall_s'] / 60:.0f} min, peak RSS {r['peak_rss_gib']:.2f} GiB\n",
            render(r),
            "",
            f"Beside BFCL's leaderboard ({leaderboard.load()['source']['title']}; its small "
            "models):\n",
            leaderboard.beside(r),
            "",
            "Irrelevance: on the leaderboard a pass is no call; here, under "
            '`"required"`, a pass calls only the graph\'s `decline` tool.',
        ]
    )
    if not update_docs("bfcl_whole", text):
        raise RuntimeError("no page has the bfcl_whole markers (docs/bfcl.md)")
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--controls", default="1,2")
    p.add_argument("--extra", default="", help="more flags for the example, as one string")
    p.add_argument(
        "--tag", default="", help="name these runs apart (the CI arm's: --tag ci with its flags)"
    )
    p.add_argument(
        "--keep",
        type=Path,
        help="keep each run's folder (its trained model, for --whole) under this one",
    )
    p.add_argument("--combine", action="store_true")
    p.add_argument(
        "--whole",
        type=Path,
        help="a run's --out folder: score its untrained and trained model on BFCL's whole "
        "non-live categories (examples.bfcl.whole) instead",
    )
    p.add_argument(
        "--publish-whole",
        type=Path,
        help="a saved bfcl_whole_*.json: put its tables into docs/bfcl.md again",
    )
    args = p.parse_args(argv)
    if args.publish_whole:
        print(publish_whole(args.publish_whole))
        return
    host = host_key(cpu_flags())  # this host's class: the runs made here
    if args.whole:
        print(run_whole(args.whole, host))
        return
    if args.combine:
        print(combine(host, args.tag))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bfcl-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)  # --keep's folder may not exist yet
        for seed, control in _order(args.seeds, args.controls):
            run_one(seed, control, args.extra.split(), folder, host, args.tag, bool(args.keep))
    print(combine(host, args.tag))


if __name__ == "__main__":
    main()
