"""Scenarios and the programmatic reward for the book-facts server (examples/mcp_books).

    python -m examples.mcp_books.tasks    # rewrite scenarios.jsonl beside this file

A scenario asks who wrote one of 24 books, or when it was first published, in one of
twelve phrasings (six per tool). Solving one takes two tool calls: the lookup, then
`complete_task` with what it returned. The split is by book, with wording as a second
axis, as in the capitals task: a held-out scenario asks about one of a third of the books
(`HELD_OUT_BOOKS`) in any phrasing (96), labelled "wording unseen" when its phrasing is one
of the two per tool training never uses (`HELD_OUT_PHRASINGS`), else "wording seen"; a
training scenario asks about one of the other 16 books in one of the other eight
phrasings (128). (Persuasion's author also wrote a training book, Emma, so it stays in
training.)

`score(trajectory, scenario)`: 1.0 when the final answer holds the expected one (the
author's surname, or the year), names no other book's, and a lookup of the episode
returned it (`art_langgraph.rewards.check_answer`; a right answer without the lookup is
counted as `right_without_lookup`); else 0.5 when the right tool was called with the right
title, 0.25 when the right tool was called at all, else 0.0.

Written apart from the defaults' choice: the defaults were swept on the bundled
capital/currency task only, and this task checks that they carry over.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import art_langgraph as art
from art_langgraph.rewards import check_answer
from art_mcp.scenarios import Scenario, save_scenarios
from examples.mcp_books.server import BOOKS

HERE = Path(__file__).resolve().parent
PHRASINGS = [
    ("author", "Who wrote {}?"),
    ("author", "Who is the author of {}?"),
    ("author", "Name the author of {}."),
    ("author", "Tell me who wrote the book {}."),
    ("author", "{}: who wrote it?"),
    ("author", "I need the author of {}."),
    ("year", "When was {} published?"),
    ("year", "In what year was {} first published?"),
    ("year", "Name the publication year of {}."),
    ("year", "Which year did {} come out?"),
    ("year", "{}: when was it published?"),
    ("year", "I need the publication year of {}."),
]
HELD_OUT_BOOKS = (
    "Candide",
    "Dune",
    "Heidi",
    "Lolita",
    "Nostromo",
    "Siddhartha",
    "Ulysses",
    "Walden",
)
"""Books never trained on (a third of the 24)."""
HELD_OUT_PHRASINGS = (1, 4, 7, 10)
"""Indexes into PHRASINGS never trained on: two per tool."""


def _answer(book: str, tool: str) -> str:
    writer, published = BOOKS[book]
    return writer.split()[-1] if tool == "author" else str(published)


def build(seed: int = 0) -> list[Scenario]:
    """Every held-out book in every phrasing and every training book in the training
    phrasings, each a scenario with its split, shuffled."""
    pairs = [(b, p) for b in sorted(BOOKS) for p in range(len(PHRASINGS))]
    random.Random(seed).shuffle(pairs)
    out = []
    for book, p in pairs:
        held_out, unseen = book in HELD_OUT_BOOKS, p in HELD_OUT_PHRASINGS
        if unseen and not held_out:
            continue  # a training book in a held-out wording: in neither split
        tool, phrasing = PHRASINGS[p]
        metadata: dict[str, Any] = {"tool": tool, "args": {"title": book}, "entity": book}
        if held_out:
            metadata["slice"] = "wording unseen" if unseen else "wording seen"
        out.append(
            Scenario(
                id=f"{tool}-{book.lower()}-{p}",
                task=phrasing.format(book),
                difficulty=1,
                answer=_answer(book, tool),
                split="val" if held_out else "train",
                metadata=metadata,
            )
        )
    return out


def candidates(scenario: Scenario) -> list[str]:
    """The values the asked tool returns across the books."""
    return sorted({_answer(b, scenario.metadata["tool"]) for b in BOOKS})


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    """The reward (see the module doc)."""
    answer = str(traj.metadata.get("answer") or "")
    check = check_answer(answer, scenario.answer or "", traj, candidates(scenario))
    traj.metrics["right_without_lookup"] = check.right_without_lookup
    if check.success:
        return 1.0
    want = scenario.metadata
    best = 0.0
    for ev in traj.tool_events:
        if ev.name == want.get("tool"):
            best = max(best, 0.5 if ev.error is None and ev.args == want.get("args") else 0.25)
    return best


if __name__ == "__main__":
    save_scenarios(HERE / "scenarios.jsonl", build())
    print(f"wrote {HERE / 'scenarios.jsonl'}")
