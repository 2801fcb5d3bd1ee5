"""Where a run stands among small models on BFCL's public leaderboard.

`leaderboard.json` holds the leaderboard's non-live rows for every model of at most 1.7B
parameters (by its name), copied from BFCL's own published table: `data_non_live.csv` on
the gh-pages branch of ShishirPatil/gorilla, the 2025-12-16 update (models evaluated at
BFCL checkpoint f7cf735; the file's `source` says which commit). `beside` sets a whole
evaluation (`examples.bfcl.whole`) in the same columns, so a reader can place a 135M model.

Left out: the leaderboard's live, multi-turn and agentic columns (this example never
evaluates those categories), and any claim that the two are the same measurement: the
leaderboard scored each model with its own handler (its prompt or function-calling
format) on BFCL's data at that checkpoint; the example scores its LangGraph graph, whose
tools are the item's functions plus `decline` under `tool_choice="required"`, on the data
of the bfcl-eval release its environment installs, by the same checker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LEADERBOARD = Path(__file__).with_name("leaderboard.json")
COLUMNS = (
    ("non_live", "non-live overall"),
    ("simple_python", "simple python"),
    ("simple_java", "simple java"),
    ("simple_javascript", "simple js"),
    ("multiple", "multiple"),
    ("parallel", "parallel"),
    ("parallel_multiple", "parallel multiple"),
    ("irrelevance", "irrelevance"),
)
"""The leaderboard's non-live columns, by the example's category names."""


def load() -> dict[str, Any]:
    """The leaderboard file: its `source` and `rows` (accuracies as fractions)."""
    data: dict[str, Any] = json.loads(LEADERBOARD.read_text())
    return data


def ours(whole: dict[str, Any], label: str) -> dict[str, float]:
    """A whole evaluation's `label` ("untrained" or "after") in the leaderboard's columns;
    irrelevance under the graph's `"required"` (a pass: only `decline` called)."""
    t = whole["table"][label]
    row = {c: float(t["categories"][c]["accuracy"]) for c, _ in COLUMNS if c != "non_live"}
    return {"non_live": float(t["non_live"]), **row}


def beside(whole: dict[str, Any], name: str = "SmolLM2-135M-Instruct") -> str:
    """A markdown table: the leaderboard's small models by rank, then `name` untrained and
    after the run that `whole` scored."""
    data = load()
    head = "| model | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|---|" + "---:|" * len(COLUMNS)]

    def line(model: str, row: dict[str, float]) -> str:
        return f"| {model} | " + " | ".join(f"{row[c]:.2f}" for c, _ in COLUMNS) + " |"

    for row in data["rows"]:
        lines.append(line(row["model"], row))
    for label, what in (("untrained", "untrained"), ("after", "after the run, this example")):
        lines.append(line(f"**{name}, {what}**", ours(whole, label)))
    return "\n".join(lines)
