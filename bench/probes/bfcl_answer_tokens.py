"""How many tokens a right BFCL answer takes, against the example's `max_tokens`.

For every item of the example's split (`examples/bfcl/splits.json`: the train half, its
validation slice, the held-out sample), the shortest right answer BFCL's possible answers
allow is built (each call with its function's name as the example binds it, each argument
at its shortest acceptable value, optional ones left out) and rendered as the model's turn by
the engine's own chat format (`ChatFormat`: the generic `<tool_call>` blocks SmolLM2
gets, the turn's end token included). The table gives, per category and split, the
median and 95th percentile of those lengths and the share that fits in
`examples.bfcl.app.MAX_TOKENS` and in a few larger budgets: an answer that does not fit
cannot pass, whatever the model learns.

    .venv/bin/python -m bench.probes.bfcl_answer_tokens

Needs `.venv-bfcl` (./scripts/setup-bfcl.sh). Left out: the answers a model writes
(longer: spaces, optional arguments, repeated calls) and the prompt's length.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench.readme import publish, results_dir

BUDGETS = (192, 256, 320)
SPLITS = ("train", "validation", "eval_sample")


def shortest_answer(item: dict[str, Any]) -> list[dict[str, Any]]:
    """The item's calls with each argument at its shortest acceptable value (as JSON); an
    optional argument (one whose acceptable values include "") left out."""
    calls = []
    for expected in item["ground_truth"]:
        ((name, params),) = expected.items()
        args = {
            k: min(v, key=lambda x: len(json.dumps(x))) for k, v in params.items() if "" not in v
        }
        calls.append({"function": {"name": name.replace(".", "_"), "arguments": args}})
    return calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = p.parse_args()
    from transformers import AutoTokenizer

    from art_langgraph.chat.templates import ChatFormat
    from art_langgraph.presets import resolve_preset
    from examples.bfcl.app import CALLING, MAX_TOKENS
    from examples.bfcl.checker import BfclChecker
    from examples.bfcl.splits import load_splits

    tokenizer = AutoTokenizer.from_pretrained(resolve_preset("smollm2-135m"))
    chat = ChatFormat.of(tokenizer)
    splits = load_splits()

    def length(item: dict[str, Any]) -> int:
        user = [{"role": "user", "content": "q"}]
        turn = {"role": "assistant", "content": "", "tool_calls": shortest_answer(item)}
        whole = chat.render([*user, turn], add_generation_prompt=False)
        head = chat.render(user, add_generation_prompt=True)
        assert whole.startswith(head)
        return len(tokenizer.encode(whole[len(head) :].rstrip("\n"), add_special_tokens=False))

    budgets = sorted({MAX_TOKENS, *BUDGETS})
    rows: dict[str, dict[str, Any]] = {}
    with BfclChecker() as checker:
        for c in CALLING:
            items = {it["id"]: it for it in checker.items(c)}
            for split in SPLITS:
                lengths = sorted(length(items[i]) for i in splits[split].get(c, []))
                rows[f"{c}/{split}"] = {
                    "items": len(lengths),
                    "median": statistics.median(lengths),
                    "p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))],
                    "max": lengths[-1],
                    "fits": {str(b): sum(n <= b for n in lengths) / len(lengths) for b in budgets},
                }
    lines = [
        "Tokens of the shortest right answer, SmolLM2-135M's tokenizer and tool-call format "
        f"(the example's `max_tokens` is {MAX_TOKENS})\n",
        "| category / split | items | median | 95th pct | max | "
        + " | ".join(f"fits {b}" for b in budgets)
        + " |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(budgets),
    ]
    for key, r in rows.items():
        fits = " | ".join(f"{r['fits'][str(b)]:.0%}" for b in budgets)
        lines.append(
            f"| {key} | {r['items']} | {r['median']:.0f} | {r['p95']} | {r['max']} | {fits} |"
        )
    path = results_dir("bfcl_answer_tokens") / "bfcl_answer_tokens.json"
    publish("bfcl_answer_tokens", path, lines, args, max_tokens=MAX_TOKENS, rows=rows)
    print(json.dumps({k: v["fits"] for k, v in rows.items()}))


if __name__ == "__main__":
    main()
