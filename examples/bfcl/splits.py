"""The fixed train / held-out split of BFCL's non-live Python categories, by function name.

A held-out item's functions never occur in a training item, in any category: items that
share a function name (across simple_python, multiple, parallel, parallel_multiple and
irrelevance) form one component, and a component lies wholly in one split. Components are
dealt, in a seeded shuffle, to the held-out split while it holds under half of each of
their categories; the rest train. From the training half, a validation slice (a tenth of
each category, again whole components) is kept for choices (learning rate, steps, the
reward's shape); the held-out half is for the reported figures only. The evaluation sample
a run scores is the first `EVAL_PER_CATEGORY` held-out ids of each category in a seeded
shuffle, the same in every run.

    python -m examples.bfcl.splits     # rewrites splits.json from BFCL's data (needs .venv-bfcl)

The ids are committed in `splits.json`; this module reads them (`load_splits`). Left out:
every other BFCL category (live, multi-turn, memory, web search, format sensitivity),
kept untouched as a transfer test.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from examples.bfcl.checker import CATEGORIES, BfclChecker

SPLITS_FILE = Path(__file__).with_name("splits.json")
SEED = 20261128
EVAL_PER_CATEGORY = 40
VALIDATION_SHARE = 0.1


def _components(items: list[dict[str, Any]]) -> list[list[str]]:
    """Item ids grouped so that items sharing any function name share a group."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for item in items:
        for f in item["function"]:
            parent[find("id:" + item["id"])] = find("fn:" + f["name"])
    groups: dict[str, list[str]] = defaultdict(list)
    for item in items:
        groups[find("id:" + item["id"])].append(item["id"])
    return sorted(groups.values())


def _category(item_id: str) -> str:
    return item_id.rsplit("_", 1)[0]


def _deal(
    components: list[list[str]], share: float, totals: dict[str, int], rng: random.Random
) -> tuple[list[list[str]], list[list[str]]]:
    """Deal shuffled components to a split that stays under `share` of each category."""
    order = components[:]
    rng.shuffle(order)
    chosen, rest = [], []
    fill: dict[str, int] = defaultdict(int)
    for comp in order:
        counts: dict[str, int] = defaultdict(int)
        for i in comp:
            counts[_category(i)] += 1
        if all(fill[c] + n <= share * totals[c] for c, n in counts.items()):
            chosen.append(comp)
            for c, n in counts.items():
                fill[c] += n
        else:
            rest.append(comp)
    return chosen, rest


def make_splits(items: list[dict[str, Any]]) -> dict[str, Any]:
    rng = random.Random(SEED)
    totals: dict[str, int] = defaultdict(int)
    for item in items:
        totals[_category(item["id"])] += 1
    heldout, train = _deal(_components(items), 0.5, totals, rng)
    train_totals: dict[str, int] = defaultdict(int)
    for comp in train:
        for i in comp:
            train_totals[_category(i)] += 1
    validation, train = _deal(train, VALIDATION_SHARE, train_totals, rng)

    def by_category(comps: list[list[str]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {c: [] for c in CATEGORIES}
        for comp in comps:
            for i in comp:
                out[_category(i)].append(i)
        return {c: sorted(ids, key=lambda x: int(x.rsplit("_", 1)[1])) for c, ids in out.items()}

    held = by_category(heldout)
    sample = {}
    for c, ids in held.items():
        shuffled = ids[:]
        random.Random(f"{SEED}-{c}").shuffle(shuffled)
        sample[c] = shuffled[:EVAL_PER_CATEGORY]
    return {
        "about": "BFCL v4 (bfcl-eval 2026.3.23) non-live Python categories, split by function "
        "name; written by `python -m examples.bfcl.splits`",
        "seed": SEED,
        "train": by_category(train),
        "validation": by_category(validation),
        "heldout": held,
        "eval_sample": sample,
    }


def load_splits() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SPLITS_FILE.read_text())
    return data


def main() -> None:
    with BfclChecker() as checker:
        items = [it for c in CATEGORIES for it in checker.items(c)]
    splits = make_splits(items)
    SPLITS_FILE.write_text(json.dumps(splits, indent=1) + "\n")
    for c in CATEGORIES:
        print(
            f"{c}: train {len(splits['train'][c])}, validation {len(splits['validation'][c])}, "
            f"held-out {len(splits['heldout'][c])} (evaluation sample {len(splits['eval_sample'][c])})"
        )


if __name__ == "__main__":
    main()
