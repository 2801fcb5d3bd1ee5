"""The RL-step benchmark's command line: run both sides, the packing test, report, save."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.readme import update_docs, write_results
from bench.rl_step.common import RESULTS, peak_rss_mib
from bench.rl_step.ours import run_ours
from bench.rl_step.packing import run_packing
from bench.rl_step.report import report
from bench.rl_step.trl_side import TrlChild, run_trl


async def ours_and_trl(
    args: argparse.Namespace, tmpdir: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    print("starting TRL GRPOTrainer in a child process...", file=sys.stderr, flush=True)
    trl = await TrlChild.start(args)
    try:
        ours = await run_ours(args, tmpdir, trl)
        return ours, await trl.finish()
    finally:
        trl.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="prompts (groups) per step, P")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt, G")
    ap.add_argument("--completion-tokens", type=int, default=32, help="tokens per completion, C")
    ap.add_argument("--steps", type=int, default=5, help="timed RL steps per side (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed RL steps first")
    ap.add_argument("--swap-steps", type=int, default=5, help="extra steps to time the swap")
    ap.add_argument("--pack-seqs", type=int, default=48, help="sequences for the packing test")
    ap.add_argument("--pack-repeats", type=int, default=3, help="timed rounds of the packing test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--base-model", default="tiny", help="the preset both sides train: tiny or smollm2-135m"
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON results file")
    ap.add_argument(
        "--only",
        choices=["all", "trl", "ours"],
        default="all",
        help="all (default); trl: TRL's steps alone; ours: our RL steps alone (for profiling)",
    )
    ap.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--lockstep", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    block = "rl_step" if args.base_model == "tiny" else f"rl_step_{args.base_model}"
    if args.out is None:
        args.out = RESULTS.with_name(f"{block}.json")
    if (
        min(args.prompts, args.group_size, args.completion_tokens, args.steps) < 1
        or min(args.warmup, args.swap_steps, args.pack_repeats - 1) < 0
        or args.pack_seqs < 1
        or args.group_size < 2
    ):
        ap.error("sizes and --steps must be >= 1 (--group-size >= 2), --warmup/--swap-steps >= 0")
    torch.manual_seed(args.seed)
    if args.only == "trl":
        res = run_trl(args)
        if args.json_out is None:
            print(json.dumps(res, indent=2))
        else:
            write_results(args.json_out, res)
        return

    if args.only == "ours":  # for profiling: our RL steps alone, nothing saved
        with tempfile.TemporaryDirectory(prefix="rl_step.") as tmpdir:
            print(json.dumps(asyncio.run(run_ours(args, tmpdir))["steps"], indent=2))
        return

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rl_step.") as tmpdir:
        ours, trl_res = asyncio.run(ours_and_trl(args, tmpdir))
    pk = run_packing(args)
    ours["rss_end_mib"] = peak_rss_mib()
    args.bench_seconds = time.perf_counter() - t_start
    result = report(args, trl_res, ours, pk)
    print(result["header"])
    print()
    print(result["markdown"])
    print()
    for line in result["target_lines"]:
        print(line)
    write_results(args.out, result)
    print(f"saved {args.out} ({args.bench_seconds:.0f} s)")
    if args.out == RESULTS.with_name(f"{block}.json"):
        text = "\n".join([result["header"], "", result["markdown"], "", *result["target_lines"]])
        if update_docs(block, text):
            print("updated README.md")
