"""Put a benchmark's latest table into the docs, between its two marker comments.

    <!-- bench:NAME:start --> ... <!-- bench:NAME:end -->

Every benchmark calls `update_docs(NAME, text)` after saving its JSON, so the docs
always show the last measured table; `publish` does the three steps a table-printing
benchmark ends with (print the table, save the JSON with the date, host and arguments,
update the docs). The markers live in `docs/benchmarks.md` and `docs/results.md` (and the
config tables' markers, `kind="config"`, in `docs/configuration.md`, which
`scripts/docs.py` fills); the first page that holds a block's markers gets the text.
Left out: anything but the text between markers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any

from art_langgraph.utils import atomic_write

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


def publish(name: str, path: Path, lines: list[str], args: argparse.Namespace, **data: Any) -> None:
    """A benchmark's last step: print its table (`lines`), save `data` as JSON at `path`
    with the date, the host (machine and matmul-relevant CPU flags), the arguments and the
    table, then put the table into the docs between `name`'s markers."""
    from art_langgraph.runtime.devices import matmul_flags

    text = "\n".join(lines)
    print(text)
    write_results(
        path,
        {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
            "host": {"cpu_flags": matmul_flags(), "machine": platform.machine()},
            "args": vars(args),
            **data,
            "table": lines,
        },
    )
    update_docs(name, text)
