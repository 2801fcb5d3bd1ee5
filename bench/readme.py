"""Put a benchmark's latest table into the docs, between its two marker comments.

    <!-- bench:NAME:start --> ... <!-- bench:NAME:end -->

Every benchmark calls `update_readme(NAME, text)` after saving its JSON, so the docs
always show the last measured table. The markers live in `docs/benchmarks.md` and `docs/results.md` (and the
config tables' markers, `kind="config"`, in `docs/configuration.md`, which
`scripts/docs.py` fills); the first page that holds a block's markers gets the text.
Left out: anything but the text between markers.
"""

from __future__ import annotations

import json
from pathlib import Path

from art_langgraph.utils import atomic_write

__all__ = ["PAGES", "update_docs", "update_readme", "write_results"]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
RESULTS = ROOT / "docs" / "results.md"
PAGES = (BENCHMARKS, CONFIGURATION, RESULTS, README)
"""Where marker blocks are looked for, in this order."""


def write_results(path: Path, data: dict) -> None:
    """Save a benchmark's results as JSON, atomically (temp file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def update_docs(name: str, text: str, page: Path | None = None, kind: str = "bench") -> bool:
    """Replace the block for `name` in `page` (None: the first of `PAGES` that has its
    markers); returns False when no page has markers for it."""
    start, end = f"<!-- {kind}:{name}:start -->", f"<!-- {kind}:{name}:end -->"
    for candidate in (page,) if page is not None else PAGES:
        body = candidate.read_text() if candidate.exists() else ""
        if start not in body or end not in body:
            continue
        head, rest = body.split(start, 1)
        _, tail = rest.split(end, 1)
        with atomic_write(candidate) as f:
            f.write(f"{head}{start}\n{text.strip()}\n{end}{tail}")
        return True
    return False


def update_readme(name: str, text: str, readme: Path | None = None, kind: str = "bench") -> bool:
    """The name every benchmark calls: `update_docs` (the tables moved from the README to
    the docs pages; the README keeps only headline numbers)."""
    return update_docs(name, text, readme, kind)
