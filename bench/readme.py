"""Put a benchmark's latest table into README.md, between its two marker comments.

    <!-- bench:NAME:start --> ... <!-- bench:NAME:end -->

Every benchmark calls `update_readme(NAME, text)` after saving its JSON, so the README
always shows the last measured table. Left out: anything but the text between markers.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["update_readme"]

README = Path(__file__).resolve().parent.parent / "README.md"


def update_readme(name: str, text: str, readme: Path = README, kind: str = "bench") -> bool:
    """Replace the block for `name`; returns False when the README has no markers for it."""
    start, end = f"<!-- {kind}:{name}:start -->", f"<!-- {kind}:{name}:end -->"
    body = readme.read_text()
    if start not in body or end not in body:
        return False
    head, rest = body.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{text.strip()}\n{end}{tail}"
    fd, tmp = tempfile.mkstemp(dir=readme.parent, prefix=".README.")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, readme)
    return True
