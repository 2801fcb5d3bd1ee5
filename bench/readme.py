"""Put a benchmark's latest table into README.md, between its two marker comments.

    <!-- bench:NAME:start --> ... <!-- bench:NAME:end -->

Every benchmark calls `update_readme(NAME, text)` after saving its JSON, so the README
always shows the last measured table. Left out: anything but the text between markers.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["update_readme", "write_results"]

README = Path(__file__).resolve().parent.parent / "README.md"


def write_results(path: Path, data: dict) -> None:
    """Save a benchmark's results as JSON, atomically (temp file in the same folder, then rename)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
