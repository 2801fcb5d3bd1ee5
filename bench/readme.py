"""Put a benchmark's latest table into README.md, between its two marker comments.

    <!-- bench:NAME:start --> ... <!-- bench:NAME:end -->

Every benchmark calls `update_readme(NAME, text)` after saving its JSON, so the README
always shows the last measured table. Left out: anything but the text between markers.
"""

from __future__ import annotations

import json
from pathlib import Path

from art_langgraph.utils import atomic_write

__all__ = ["update_readme", "write_results"]

README = Path(__file__).resolve().parent.parent / "README.md"


def write_results(path: Path, data: dict) -> None:
    """Save a benchmark's results as JSON, atomically (temp file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def update_readme(name: str, text: str, readme: Path = README, kind: str = "bench") -> bool:
    """Replace the block for `name`; returns False when the README has no markers for it."""
    start, end = f"<!-- {kind}:{name}:start -->", f"<!-- {kind}:{name}:end -->"
    body = readme.read_text()
    if start not in body or end not in body:
        return False
    head, rest = body.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{text.strip()}\n{end}{tail}"
    with atomic_write(readme) as f:
        f.write(new)
    return True
