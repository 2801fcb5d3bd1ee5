"""How much of a BFCL evaluation's decoding comes after BFCL's verdict is already settled:
would stopping each request there pay for itself?

Runs the example's untrained evaluation requests (`examples.bfcl.app`: the fixed held-out
sample, each item greedy and sampled at T=1 with the example's seeds, under
`tool_choice="required"`, `max_tokens` as the example's) and, for each answer, finds the
first completion token after which BFCL's verdict can no longer change:

- a calling item (simple_python, multiple, parallel, parallel_multiple): the token that
  closes a call beyond the count BFCL's answer has. The example's parse keeps complete
  calls only, and every BFCL checker of these categories fails a wrong count first
  (`wrong_count`), so later tokens cannot change the verdict nor its error type;
- an irrelevance item: the token that closes a call other than the graph's `decline`
  (BFCL: a call where none belonged).

The table gives, per category and mode, the completion tokens the answers took and the
share that came after their verdict was settled: the most a server-side stop (or a client
closing its stream there) could save of the decode work. Irrelevance's greedy requests
under `"auto"` are left out: without a grammar a later malformed block turns a whole answer
into prose, so no earlier token settles it.

    .venv/bin/python -m bench.probes.bfcl_settled [--limit N]

Needs `.venv-bfcl` (./scripts/setup-bfcl.sh). Left out: trained models (which stop after
fewer calls, so less would be saved), the prefill (untouched by a stop), wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import tempfile
from typing import Any

from art_langgraph.chat.format import TOOL_CALL_CLOSE
from bench.readme import publish, results_dir
from bench.trainer_roofline import cpu_flags
from examples.bfcl.answers import DECLINE
from examples.bfcl.app import TRAINABLE


def settled_at(tok: Any, ids: list[int], names: list[str], expected: int | None) -> int:
    """The number of completion tokens after which the verdict is settled (len(ids) when it
    never is): `names` are the answer's calls in order, `expected` the count BFCL's answer
    has (None: an irrelevance item)."""
    closed = 0
    for k in range(1, len(ids) + 1):
        now = tok.decode(ids[:k]).count(TOOL_CALL_CLOSE)
        if now == closed:
            continue
        closed = now
        if expected is None:
            if closed <= len(names) and names[closed - 1] != DECLINE:
                return k
        elif closed > expected:
            return k
    return len(ids)


async def _answers(limit: int | None, out: str) -> tuple[str, list[dict[str, Any]]]:
    """The example's base model and its untrained answers, one a request."""
    import art_langgraph as art
    from examples.bfcl.app import MAX_TOKENS, Run, build_graph, parser, trainable_model

    ex = parser().parse_args(["--out", out])
    run = Run(ex)
    rows: list[dict[str, Any]] = []
    try:
        model = trainable_model(ex)
        await model.register(art.LocalBackend(path=f"{out}/art"))
        chats = {
            "greedy": model.chat_model(temperature=0, max_tokens=MAX_TOKENS),
            "sampled": model.chat_model(temperature=1.0, max_tokens=MAX_TOKENS),
        }
        gate = asyncio.Semaphore(32)  # as the example's evaluation

        async def one(category: str, item_id: str, mode: str, seed: int) -> None:
            item = run.items[item_id]
            graph = build_graph(chats[mode], item["tools"], "required", seed)
            async with gate:
                output = await graph.ainvoke({"messages": item["question"][0]})
            message = output["messages"][-1]
            truth = item.get("ground_truth")
            rows.append(
                {
                    "category": category,
                    "mode": mode,
                    "ids": list(message.response_metadata.get("token_ids") or []),
                    "names": [tc["name"] for tc in message.tool_calls],
                    "expected": None if category == "irrelevance" else len(truth or []),
                }
            )

        jobs = []
        n = 0
        for category in TRAINABLE:
            for item_id in run.splits["eval_sample"][category][:limit]:
                seed = art.derive_seed(ex.seed, 1, n)  # the example's evaluation seeds
                n += 1
                jobs += [one(category, item_id, mode, seed) for mode in chats]
        await asyncio.gather(*jobs)
    finally:
        run.checker.close()
    return ex.base_model, rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=None, help="items a category (smoke runs)")
    args = p.parse_args()
    from transformers import AutoTokenizer

    from art_langgraph.presets import resolve_preset

    with tempfile.TemporaryDirectory() as tmp:
        base_model, rows = asyncio.run(_answers(args.limit, tmp))
    tok = AutoTokenizer.from_pretrained(resolve_preset(base_model))
    total: collections.Counter[tuple[str, str]] = collections.Counter()
    after: collections.Counter[tuple[str, str]] = collections.Counter()
    count: collections.Counter[tuple[str, str]] = collections.Counter()
    for r in rows:
        key = (r["category"], r["mode"])
        stop = settled_at(tok, r["ids"], r["names"], r["expected"])
        total[key] += len(r["ids"])
        after[key] += len(r["ids"]) - stop
        count[key] += 1
    lines = [
        f'The example\'s untrained evaluation requests under `"required"`, {base_model}, '
        f"{len(rows)} answers, CPU flags {cpu_flags()}\n",
        "| category | mode | answers | completion tokens | after the verdict was settled | share |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key in sorted(total):
        lines.append(
            f"| {key[0]} | {key[1]} | {count[key]} | {total[key]:,} | {after[key]:,} | "
            f"{after[key] / max(1, total[key]):.0%} |"
        )
    all_total, all_after = sum(total.values()), sum(after.values())
    lines.append(
        f"| **all** | | **{len(rows)}** | **{all_total:,}** | **{all_after:,}** | "
        f"**{all_after / max(1, all_total):.0%}** |"
    )
    publish(
        "bfcl_settled",
        results_dir("bfcl_settled") / "bfcl_settled.json",
        lines,
        args,
        rows={f"{c}/{m}": [count[(c, m)], total[(c, m)], after[(c, m)]] for c, m in sorted(total)},
    )


if __name__ == "__main__":
    main()
