"""BFCL's whole non-live categories, untrained and after a run of the example, with BFCL's
own non-live overall: where a 135M model trained on half of them stands.

    python -m examples.bfcl --seed 0 --out runs/bfcl-s0     # a run, its model kept
    python -m examples.bfcl.whole --run runs/bfcl-s0        # then this, once

Every item of simple_python, simple_java, simple_javascript, multiple, parallel,
parallel_multiple and irrelevance goes through the example's graph (`app.build_graph`,
`tool_choice="required"`, greedy, as BFCL evaluates), under the untrained model (step 0 of
the run's model) and under its last step, and BFCL's checker scores each. The categories
the run trained on (its `--train-categories`: by default simple_python, multiple and
irrelevance) are labelled "half of it trained on": their train split was (`splits.json`);
the others' items were never trained on (parallel and parallel_multiple are split, but the
default mix draws neither; Java and JavaScript are never split). BFCL's non-live overall
comes from BFCL's code (`BfclChecker.overall`): the mean of simple (python, java,
javascript), multiple, parallel and parallel_multiple; irrelevance is its own column there
(a pass: the model calls only the graph's `decline` tool), and is also reported under
`"auto"`, where the model may answer without any call.

Each category's verdicts land in `whole.partial.json` as it ends, so a run stopped part way
(it takes hours on 2 cores) resumes where it stopped when started again with the same code,
`--limit` and trained run (its `result.json`); otherwise it starts over. Writes
`whole.json`, stamped with the commit, code and arguments, into the run's folder;
`python -m bench.learning_bfcl --whole runs/bfcl-s0` runs this and keeps it in
bench/results/learning_bfcl/bfcl_whole_<host>_<run>.json. Left out: the live, multi-turn, memory,
web-search and format-sensitivity categories (a transfer test nobody here tunes on).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import art_langgraph as art
from art_langgraph.runtime.allocator import allocator_in_use
from art_langgraph.runtime.devices import matmul_flags
from art_langgraph.utils import atomic_write
from examples.bfcl.app import MAX_TOKENS, Run, Tally, trainable_model
from examples.bfcl.checker import CATEGORIES, WHOLE_ONLY
from examples.bfcl.record import code_hash, commit_stamp

CONCURRENCY = 32
"""Graphs run at once (the example's evaluation runs as many)."""


async def _passes(
    run: Run, chat: Any, items: list[dict[str, Any]], choice: str, tally: Tally, key: str
) -> None:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(item: dict[str, Any]) -> dict[str, Any] | str:
        async with limit:
            return await run.answer(item, chat, choice)

    for item, answer in zip(items, await asyncio.gather(*map(one, items)), strict=True):
        tally.add(key, item["id"], answer)


class Progress:
    """The verdicts of the categories scored so far, kept in `whole.partial.json` (written
    whole after each one), so a stopped evaluation resumes at the first category it lacks.
    `stamp` (this code, `--limit`, the run scored) must match, or it starts over."""

    def __init__(self, path: Path, stamp: dict[str, Any]) -> None:
        self.path, self.stamp = path, stamp
        self.seconds: dict[str, float] = {}
        self.tally = Tally()
        saved = json.loads(path.read_text()) if path.exists() else {}
        self.resumed = saved.get("stamp") == stamp
        if self.resumed:
            self.seconds = saved["seconds"]
            self.tally.per_item = saved["per_item"]
            self.tally.errors = saved["errors"]
            self.tally.error_types = saved["error_types"]
        elif saved:
            print(f"{path.name} was scored by other code or arguments: starting over")

    def done(self, key: str) -> bool:
        return key in self.seconds

    def took(self, label: str) -> float:
        """Seconds spent scoring `label`'s categories ("untrained" or "after"), resumed ones too."""
        return round(sum(v for k, v in self.seconds.items() if k.startswith(f"{label}/")), 1)

    def save(self, key: str, seconds: float) -> None:
        self.seconds[key] = round(seconds, 1)
        t = self.tally
        with atomic_write(self.path) as f:
            f.write(
                json.dumps(
                    {
                        "stamp": self.stamp,
                        "seconds": self.seconds,
                        "per_item": t.per_item,
                        "errors": t.errors,
                        "error_types": t.error_types,
                    }
                )
            )


async def whole(args: argparse.Namespace) -> dict[str, Any]:
    start = time.monotonic()
    commit, code = commit_stamp(), code_hash()
    folder = Path(args.run)
    trained = json.loads((folder / "result.json").read_text())
    targs = argparse.Namespace(**trained["args"])
    run_stamp = {k: trained[k] for k in ("commit", "code", "args") if k in trained}
    # the run scored: its result.json's bytes (a run trained again into this folder, even
    # with the same code and arguments, is another model)
    run_hash = hashlib.sha256((folder / "result.json").read_bytes()).hexdigest()
    bfcl = Run(targs)
    categories = [*CATEGORIES[:-1], *WHOLE_ONLY, "irrelevance"]
    items = {c: bfcl.checker.items(c)[: args.limit] for c in categories}
    progress = Progress(
        folder / "whole.partial.json", {"code": code, "limit": args.limit, "run": run_hash}
    )
    tally = progress.tally
    try:
        model = trainable_model(targs)
        await model.register(art.LocalBackend(path=folder / "art"))
        last = await model.get_step()
        if last != targs.steps:
            raise SystemExit(
                f"{folder}: the model is at step {last}, the run trained {targs.steps}"
            )
        for label, step in (("untrained", 0), ("after", last)):
            chat = model.chat_model(step=step, temperature=0, max_tokens=MAX_TOKENS)
            passes = [(c, c, "required") for c in categories]
            for name, c, choice in [*passes, ("irrelevance_auto", "irrelevance", "auto")]:
                key = f"{label}/{name}"
                if progress.done(key):
                    continue
                t0 = time.monotonic()
                await _passes(bfcl, chat, items[c], choice, tally, key)
                progress.save(key, time.monotonic() - t0)
            print(f"{label}: {progress.took(label):.0f} s{tally.note()}", flush=True)
            tally.check(label)
        table: dict[str, dict[str, Any]] = {}
        for label in ("untrained", "after"):
            scores = {
                c: {"accuracy": statistics.fmean(v.values()), "total_count": len(v)}
                for c in [*categories, "irrelevance_auto"]
                for v in [tally.per_item[f"{label}/{c}"]]
            }
            table[label] = {"categories": scores, **bfcl.checker.overall(scores)}
    finally:
        bfcl.checker.close()
    result = {
        "commit": commit,
        "code": code,
        "args": vars(args),
        "run": run_stamp,
        "cpu_flags": matmul_flags(),
        "allocator": allocator_in_use(),
        "wall_s": round(time.monotonic() - start, 1),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "phases_s": {label: progress.took(label) for label in ("untrained", "after")},
        "category_s": progress.seconds,
        "resumed": progress.resumed,
        "trained_on_half": targs.train_categories.split(","),
        "table": table,
        "per_item": tally.per_item,
        "errors": tally.errors,
        "error_types": tally.error_types,
    }
    with atomic_write(folder / "whole.json") as f:
        f.write(json.dumps(result, indent=1))
    progress.path.unlink()
    print(render(result))
    return result


def render(result: dict[str, Any]) -> str:
    """The table: per category, untrained and after, then BFCL's simple and non-live overall."""
    t = result["table"]
    half = set(result["trained_on_half"])
    lines = ["| BFCL category (whole) | items | untrained | after |", "|---|---:|---:|---:|"]
    for c, row in t["untrained"]["categories"].items():
        name = c if c != "irrelevance_auto" else 'irrelevance, `"auto"`'
        note = " (half of it trained on)" if c.removesuffix("_auto") in half else ""
        after = t["after"]["categories"][c]["accuracy"]
        lines.append(
            f"| {name}{note} | {row['total_count']} | {row['accuracy']:.2f} | {after:.2f} |"
        )
    for key, name in (
        ("simple", "simple (BFCL: python, java, js)"),
        ("non_live", "non-live overall (BFCL)"),
    ):
        lines.append(f"| {name} | | {t['untrained'][key]:.3f} | {t['after'][key]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--run", required=True, help="a run's --out folder (its result.json, its model)"
    )
    ap.add_argument("--limit", type=int, default=None, help="the first N items a category (tests)")
    if argv is None:  # run as a program: on tcmalloc where installed
        art.reexec_with_tcmalloc()
    asyncio.run(whole(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
