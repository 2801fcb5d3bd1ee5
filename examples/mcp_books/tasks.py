"""Scenarios and the programmatic reward for the book-facts server (examples/mcp_books).

    python -m examples.mcp_books.tasks    # rewrite scenarios.jsonl beside this file

A scenario asks who wrote one of 24 books, or when it was first published, in one of
twelve phrasings (six per tool). Solving one takes two tool calls: the lookup, then
`complete_task` with what it returned. The split holds out books and phrasings: six
books (`HELD_OUT_BOOKS`) and two phrasings per tool (`HELD_OUT_PHRASINGS`) never appear in
training; every pair with a held-out book or phrasing is held out (144 train, 144 val),
so half of the held-out questions (72) ask about a training book in a held-out wording.

`score(trajectory, scenario)`: 1.0 when the final answer holds the expected one (the
author's surname, or the year), 0.5 when the right tool was called with the right title,
0.25 when the right tool was called at all, else 0.0.

Written apart from the defaults' choice: the defaults were swept on the bundled
capital/currency task only, and this task checks that they carry over.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import art_langgraph as art
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
HELD_OUT_BOOKS = ("Candide", "Dune", "Heidi", "Lolita", "Persuasion", "Walden")
"""Books never trained on (a quarter of the 24)."""
HELD_OUT_PHRASINGS = (1, 4, 7, 10)
"""Indexes into PHRASINGS never trained on: two per tool."""


def build(seed: int = 0) -> list[Scenario]:
    """Every (book, phrasing) pair as a scenario with its split, shuffled."""
    pairs = [(b, p) for b in sorted(BOOKS) for p in range(len(PHRASINGS))]
    random.Random(seed).shuffle(pairs)
    out = []
    for book, p in pairs:
        tool, phrasing = PHRASINGS[p]
        writer, published = BOOKS[book]
        answer = writer.split()[-1] if tool == "author" else str(published)
        out.append(
            Scenario(
                id=f"{tool}-{book.lower()}-{p}",
                task=phrasing.format(book),
                difficulty=1,
                answer=answer,
                split="val" if book in HELD_OUT_BOOKS or p in HELD_OUT_PHRASINGS else "train",
                metadata={"tool": tool, "args": {"title": book}},
            )
        )
    return out


def score(traj: art.Trajectory, scenario: Scenario) -> float:
    """The reward (see the module doc)."""
    answer = str(traj.metadata.get("answer") or "")
    if scenario.answer and re.search(
        rf"(?<![\w]){re.escape(scenario.answer)}(?![\w])", answer, re.IGNORECASE
    ):
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
