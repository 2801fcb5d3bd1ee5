"""The torch engine's memory budgets against a held-out evaluation's peak RSS and wall time.

An `art-mcp` run's memory peaks while it evaluates: every held-out episode (greedy and
sampled) is in flight at once, the running batch's KV fills its budget
(`TorchEngineConfig.max_kv_bytes`) and the prefix cache fills its own
(`prefix_cache_bytes`). This bench runs one held-out evaluation of a task, untrained (the
library's defaults, `steps=0`, no warm start), under several pairs of budgets, one arm
after another, each in a child process of its own (so each peak is its own):

- `default`: both budgets at their defaults (on the CPU: 1/16 of RAM, at most 512 MiB, and
  1/64 of RAM, at most 256 MiB; the prefix cache's was 1/32, at most 1 GiB, until this
  bench's first table);
- `kv<K>-prefix<P>`: K MiB of running KV and a P MiB prefix cache (0: off);
- either with `+head`: the engine forms a batch head (`TorchEngineConfig.batch_head`);
- either with `+decommit` (after `+head`): tcmalloc returns freed spans to the system at once
  (`TCMALLOC_AGGRESSIVE_DECOMMIT=1`) instead of keeping them for reuse.

Every child runs on tcmalloc, as `art-mcp` does (`reexec_with_tcmalloc`).

Measured per arm: the evaluation's wall time (set-up left out), the process tree's peak
RSS (`bench.memory`, the MCP server's included), the share of prompt tokens the prefix
cache served, tokens generated per second, and the greedy and sampled success (the same
episodes whatever the budgets, up to float32 rounding: a budget changes when work runs,
not what it computes). Side by side in one run: ratios against the `default` arm.

    .venv/bin/python -m bench.engine_memory [--task org] [--arms default,kv512-prefix384]
    .venv/bin/python -m bench.engine_memory --ref ../base --arms ref:default,default \
        --repeats 2 --tag prefill_packed

`--ref CHECKOUT`: arms named `ref:<arm>` run that arm from another checkout of the project
(its code on the path first, e.g. the parent commit made with `git worktree add`), under
this checkout's virtual environment, so the comparison is of the code alone. `--repeats`
runs every arm that many times, the arms alternating, so drift hits them alike.

Saved to bench/results/engine_memory/engine_memory_<task>_<host>.json; the real model's
table also goes into docs/benchmarks.md (its `engine_memory:<task>_<host>` block).

A run trains nothing; a trained run's later evaluations peaked 0.4-0.6 GiB above its
first on the two-hop task, which this does not measure. Left out:
GPUs, and the rollouts' and trainer's phases (smaller than an evaluation's, one group of
episodes at a time; the trainer runs with the prefix cache emptied).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.learning import TASK_EVAL, TASKS, host_key, run_watched, task_parts
from bench.readme import results_dir, update_docs, write_results
from bench.trainer_roofline import cpu_flags

RESULTS = results_dir("engine_memory")
_ARM = re.compile(r"(?:default|kv(\d+)-prefix(\d+))(\+head)?(\+decommit)?")


def budgets(arm: str) -> tuple[int | None, int | None]:
    """An arm's (max_kv_bytes, prefix_cache_bytes); None: the engine's default."""
    m = _ARM.fullmatch(arm)
    if m is None:
        raise SystemExit(
            f"an arm is 'default' or kv<MiB>-prefix<MiB>, either optionally +head, then "
            f"optionally +decommit; not {arm!r}"
        )
    if m[1] is None:
        return None, None
    return int(m[1]) << 20, int(m[2]) << 20


def has_head(arm: str) -> bool:
    """Whether an arm runs the engine with a batch head (`TorchEngineConfig.batch_head`)."""
    m = _ARM.fullmatch(arm.removeprefix("ref:"))
    return m is not None and m[3] is not None


def arm_env(arm: str, ref: Path | None = None) -> dict[str, str]:
    """The environment of an arm's child: this process's, plus tcmalloc's settings (and
    for a `ref:` arm, the other checkout's code first on the path)."""
    env = dict(os.environ)
    if arm.startswith("ref:"):
        assert ref is not None
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ref), env.get("PYTHONPATH")) if p)
    if arm.endswith("+decommit"):
        env["TCMALLOC_AGGRESSIVE_DECOMMIT"] = "1"
    return env


async def _evaluate(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The child: one untrained held-out evaluation under the arm's budgets."""
    import art_langgraph as art
    from art_langgraph.engine import TorchEngineConfig
    from art_langgraph.runtime.allocator import allocator_in_use
    from art_mcp import HarnessConfig, train

    kv, prefix = budgets(args.child)
    server, scenarios, reward = task_parts(args.task)
    # the task's runs' count, else the harness's default (None would evaluate them all)
    count = args.eval_scenarios or eval_scenarios(args.task)
    cfg = HarnessConfig(
        **({"eval_scenarios": count} if count else {}),
        path=str(folder),
        steps=0,
        sft_epochs=0,
        seed=args.seed,
        **({"base_model": args.base_model} if args.base_model else {}),
    )
    config = TorchEngineConfig(
        max_kv_bytes=kv, prefix_cache_bytes=prefix, batch_head=has_head(args.child)
    )
    lines: list[str] = []
    async with art.LocalBackend(
        path=str(folder), engine=art.EngineChoice("torch", config=config)
    ) as backend:
        report = await train(
            server, cfg, scenarios=scenarios, reward=reward, backend=backend, log=lines.append
        )
        assert backend.engine is not None
        m = backend.engine.metrics()
    took = next(
        float(x[1])
        for line in lines
        if (x := re.search(r"evaluation: \d+ episodes in (\d+) s", line))
    )
    ev = report.evaluations[0]
    return {
        "eval_s": took,
        "prompt_tokens": m.prompt_tokens,
        "prefix_hit_share": m.prefix_cache_hits / max(m.prefix_cache_queries, 1),
        "generated_tokens": m.generation_tokens,
        "prefix_capacity_mib": m.prefix_cache_capacity_bytes / (1 << 20),
        "greedy_success": ev.greedy_success,
        "sampled_success": ev.sampled_success,
        "episodes": len(ev.greedy) + sum(len(v) for v in ev.sampled.values()),
        "allocator": allocator_in_use(),
    }


def eval_scenarios(task: str) -> int | None:
    """How many held-out scenarios the task's runs of the defaults evaluate
    (`bench.learning.TASK_EVAL`; None: the harness's default)."""
    extra = TASK_EVAL.get(task, [])
    return int(extra[extra.index("--eval-scenarios") + 1]) if "--eval-scenarios" in extra else None


def run_arm(arm: str, args: argparse.Namespace, out: Path, round_: int = 1) -> dict[str, Any]:
    """One arm in a child process under the watchdog (a `ref:` arm from `args.ref`'s
    checkout): its figures and peak RSS."""
    out = out / f"{arm.replace(':', '-')}-{round_}"
    out.mkdir()
    child = arm.removeprefix("ref:")  # the other checkout's bench knows no ref: arms
    result = out / f"{child}.json"
    cmd = [sys.executable, "-m", "bench.engine_memory", "--child", child, "--task", args.task]
    cmd += ["--seed", str(args.seed), "--out", str(out)]
    if args.base_model:
        cmd += ["--base-model", args.base_model]
    if args.eval_scenarios:
        cmd += ["--eval-scenarios", str(args.eval_scenarios)]
    if arm.startswith("ref:"):  # from the other checkout's folder: its code, its task files
        cmd = ["env", "-C", str(args.ref), *cmd]
    rc, peak = run_watched(arm, cmd, out / "arm.log", env=arm_env(arm, args.ref))
    if rc != 0 or not result.exists():
        raise SystemExit(f"{arm} failed (rc {rc}):\n{(out / 'arm.log').read_text()[-3000:]}")
    row = {"arm": arm, "round": round_, **json.loads(result.read_text()), "peak_rss_mib": peak}
    print(
        f"{arm}: evaluation {row['eval_s']:.0f} s, peak RSS {peak:.0f} MiB, "
        f"prefix cache served {row['prefix_hit_share']:.0%}",
        flush=True,
    )
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Per arm (and round): wall, peak RSS, cache share, decode rate, success; wall ratios
    against the mean of the first arm's rounds (`default` when there is one)."""
    first = next((r["arm"] for r in rows if r["arm"] == "default"), rows[0]["arm"])
    base = statistics.mean(r["eval_s"] for r in rows if r["arm"] == first)
    rounds = max(r.get("round", 1) for r in rows) > 1
    lines = [
        f"| arms (vs {first}) | evaluation wall | wall ratio | peak RSS | prefix cache "
        "served | generated tok/s | greedy / sampled success |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = f"{r['arm']} (round {r['round']})" if rounds else r["arm"]
        # the log gives whole seconds: an evaluation under 0.5 s (the tiny preset) reads 0
        ratio = f"{r['eval_s'] / base:.2f}x" if base else "-"
        rate = f"{r['generated_tokens'] / r['eval_s']:.0f}" if r["eval_s"] else "-"
        lines.append(
            f"| {name} | {r['eval_s']:.0f} s | {ratio} | "
            f"{r['peak_rss_mib'] / 1024:.2f} GiB | {r['prefix_hit_share']:.0%} | {rate} | "
            f"{r['greedy_success']:.2f} / {r['sampled_success']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="org", choices=sorted(TASKS))
    p.add_argument("--arms", default="default,kv512-prefix256,kv384-prefix256,default+decommit")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--base-model", help="the library's default when not given")
    p.add_argument("--eval-scenarios", type=int, help="the task's runs' count when not given")
    p.add_argument("--tag", default="")
    p.add_argument("--ref", type=Path, help="another checkout, for arms named ref:<arm>")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every arm, alternating")
    p.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        from art_langgraph import reexec_with_tcmalloc

        reexec_with_tcmalloc()  # as art-mcp runs: restarts this child once, on tcmalloc
        with tempfile.TemporaryDirectory() as tmp:
            row = asyncio.run(_evaluate(args, Path(tmp)))
        (args.out / f"{args.child}.json").write_text(json.dumps(row))
        return
    arms = args.arms.split(",")
    for arm in arms:
        budgets(arm.removeprefix("ref:"))  # refuse a malformed arm before any runs
        if arm.startswith("ref:") and not (args.ref and (args.ref / "bench").is_dir()):
            raise SystemExit(f"{arm}: --ref must name another checkout of the project")
    if args.ref:
        args.ref = args.ref.resolve()
    from examples.bfcl.record import commit_stamp

    commit, t0 = commit_stamp(), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            run_arm(arm, args, Path(tmp), r) for r in range(1, args.repeats + 1) for arm in arms
        ]
    flags = cpu_flags()
    ref = f" against {args.ref.name} at {commit_stamp(args.ref)} (ref:)" if args.ref else ""
    text = (
        f"Engine budgets on one untrained held-out evaluation of the {args.task} task "
        f"(seed {args.seed}); commit {commit}{ref}; CPU flags: {flags}.\n\n" + table(rows)
    )
    print(text)
    model = f"_{args.base_model}" if args.base_model else ""
    name = f"engine_memory_{args.task}{model}_{host_key(flags)}{'_' + args.tag if args.tag else ''}"
    write_results(
        args.results / f"{name}.json",
        {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "args": sys.argv[1:],
            "cpu_flags": flags,
            "wall_s": time.perf_counter() - t0,
            "table": text,
            "rows": rows,
        },
    )
    if not args.base_model and args.results == RESULTS:  # the real model's: into the docs
        update_docs(name.removeprefix("engine_memory_"), text, kind="engine_memory")


if __name__ == "__main__":
    main()
