"""Speculative decoding by prompt lookup, on and off, side by side: does guessing from a
row's own context buy back decode steps on real agents' answers?

Each arm runs the BFCL example's own untrained evaluation (`examples.bfcl.app.Run.evaluate`)
on its training half's validation slice (a default is chosen on no held-out item):
`--limit` items a category, greedy and sampled at T=1 under `tool_choice="required"`,
irrelevance also under "auto". SmolLM2-135M on the torch engine with its defaults but
`speculative_tokens` (`off`: 0; `on`: the default; `--arms` adds arms of other settings,
`arm_config`), each arm in a child process of its own (its own peak RSS), alternating
over `--pairs` pairs. Reported per arm: the evaluation's wall time and its ratio to
`off`'s in the same pair, the engine's decode steps, the tokens it generated, the guessed
tokens kept of those fed, and whether each greedy item's BFCL verdict is the same as
`off`'s (a row decodes the same tokens either way, up to the float noise of other batch
shapes).

    .venv/bin/python -m bench.speculative [--limit 10] [--pairs 1] [--arms off,on] [--tag NAME]

Needs `.venv-bfcl` (./scripts/setup-bfcl.sh). Left out: trained models (the final
evaluation's answers repeat less), the MCP agent's rollouts (`bench.agent_rollouts`),
and vLLM's ngram speculation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from bench.memory import tree_peak_rss_mib
from bench.readme import ROOT, publish, results_dir
from bench.trainer_roofline import cpu_flags

ARMS = ("off", "on")
"""The default arms: guesses off (`speculative_tokens=0`) and the engine's defaults. Other
arms name their settings: `k2` (2 tokens a guess), `k4n3` (4 tokens, looked up from runs of
at least 3)."""


def arm_config(arm: str) -> Any:
    """The `TorchEngineConfig` an arm names."""
    from art_langgraph.engine import TorchEngineConfig

    if arm in ARMS:
        return TorchEngineConfig() if arm == "on" else TorchEngineConfig(speculative_tokens=0)
    m = re.fullmatch(r"k(\d+)(?:n(\d+))?", arm)
    if m is None:
        raise SystemExit(f"--arms: {arm!r} is not off, on or k<tokens>[n<shortest run>]")
    lo = int(m.group(2) or TorchEngineConfig.prompt_lookup_min)
    hi = max(lo, TorchEngineConfig.prompt_lookup_max)
    return TorchEngineConfig(
        speculative_tokens=int(m.group(1)), prompt_lookup_min=lo, prompt_lookup_max=hi
    )


async def _child(arm: str, limit: int) -> dict[str, Any]:
    import art_langgraph as art
    from examples.bfcl.app import Run, parser, trainable_model

    config = arm_config(arm)
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--out", tmp, "--eval-limit", str(limit), "--eval-split", "validation"]
        ex = parser().parse_args(argv)
        run = Run(ex)
        try:
            backend = art.LocalBackend(
                path=f"{tmp}/art", engine=art.EngineChoice("torch", config=config)
            )
            model = trainable_model(ex)
            await model.register(backend)
            engine: Any = backend.engine
            steps, before = engine.steps, engine.metrics()
            result = await run.evaluate(model, f"untrained, speculation {arm}")
            after = engine.metrics()
            out = {
                "arm": arm,
                "speculative_tokens": config.speculative_tokens,
                "evaluation_s": result["seconds"],
                "steps": engine.steps - steps,
                "generated": after.generation_tokens - before.generation_tokens,
                "drafted": engine.lookup.drafted,
                "kept": engine.lookup.kept,
                "per_item": result["per_item"],
                "peak_rss_mib": tree_peak_rss_mib(os.getpid()),
            }
            await backend.close()
        finally:
            run.checker.close()
    return out


def _run_arm(arm: str, limit: int) -> dict[str, Any]:
    code = (
        "import asyncio, json, sys; from bench.speculative import _child; "
        f"print('RESULT ' + json.dumps(asyncio.run(_child({arm!r}, {limit}))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line.removeprefix("RESULT ")))


def _same_greedy(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = [k for k in a["per_item"] if k.endswith("/greedy") or k.endswith("/greedy_auto")]
    items = [(k, i) for k in keys for i in a["per_item"][k]]
    same = sum(a["per_item"][k][i] == b["per_item"][k][i] for k, i in items)
    return f"{same} / {len(items)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=int, default=10, help="items a category of the sample")
    p.add_argument("--pairs", type=int, default=1, help="off/on pairs, alternating")
    p.add_argument("--tag", default="", help="a suffix for the result's file name")
    p.add_argument("--arms", default=",".join(ARMS), help="off first (the ratios' base)")
    args = p.parse_args()
    arms = args.arms.split(",")
    if arms[0] != "off":
        raise SystemExit("--arms: the first arm is off, the ratios' base")
    for arm in arms:
        arm_config(arm)
    pairs = []
    for k in range(args.pairs):
        order = arms if k % 2 == 0 else arms[::-1]
        runs = {arm: _run_arm(arm, args.limit) for arm in order}
        pairs.append(runs)
    lines = [
        f"The BFCL example's untrained evaluation on its validation slice ({args.limit} items a "
        f"category, greedy and sampled), smollm2-135m on the torch engine, {os.cpu_count()} cores, CPU flags "
        f"{cpu_flags()}; arms in child processes, alternating.\n",
        "| pair | arm | evaluation | vs off | decode steps | tokens generated | guesses kept / "
        "fed | greedy verdicts as off's | peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, runs in enumerate(pairs, 1):
        off = runs["off"]
        for arm in arms:
            r = runs[arm]
            kept = f"{r['kept']:,} / {r['drafted']:,}" if r["drafted"] else "-"
            lines.append(
                f"| {n} | {arm} | {r['evaluation_s']:.0f} s | "
                f"{r['evaluation_s'] / off['evaluation_s']:.2f}x | {r['steps']:,} | "
                f"{r['generated']:,} | {kept} | {_same_greedy(r, off)} | "
                f"{r['peak_rss_mib'] / 1024:.2f} GiB |"
            )
    name = f"speculative{'_' + args.tag if args.tag else ''}"
    publish("speculative", results_dir("speculative") / f"{name}.json", lines, args, pairs=pairs)


if __name__ == "__main__":
    main()
