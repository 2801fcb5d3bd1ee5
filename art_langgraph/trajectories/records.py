"""JSON-lines files, with one rule for a line a crash tore: every JSONL file we write.

- `append_records(path, records)`: each record (a pydantic model or a dict) one line, all
  of them in one write, flushed and fsynced. A tail an earlier crash left (bytes after the
  last newline that are not a whole record) is cut first, with a warning, so a new record
  never joins it.
- `write_records(path, records)`: the whole file, atomically (temp file, fsync, rename).
- `read_records(path, kind=None)`: every line, as a dict or validated as `kind`. The last
  line, when it has no newline and does not parse, is a crash's torn tail: skipped with a
  warning. Any other line that does not parse is an error naming the file and the line
  (`UsageError`): a whole line that is not a record is no crash's leftover.

The trajectories of every step (`trajectory.write_jsonl` / `read_groups`), the backend's
`history.jsonl` and `promotion.jsonl`, the Langfuse records in a model's folder and
art_mcp's journal all go through here.

`finite_numbers(metrics)` keeps a metrics record's finite numbers (JSON has no NaN or
infinity; a bool is not a metric), for the history, a checkpoint's marker and W&B alike.

Left out: locking (each file has one writer at a time: its owner says how), compression.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from art_langgraph.errors import UsageError

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)
_CHUNK = 1 << 16


def is_finite_number(x: Any) -> bool:
    """Whether `x` is an int or float (not a bool) that is neither NaN nor infinite."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def finite_numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The entries of `metrics` that are finite numbers (`is_finite_number`)."""
    return {k: v for k, v in metrics.items() if is_finite_number(v)}


class _NotAnObject(ValueError):
    """A line that is JSON but not an object."""


def _line(record: BaseModel | Mapping[str, Any]) -> str:
    if isinstance(record, BaseModel):
        return record.model_dump_json() + "\n"
    return json.dumps(dict(record), allow_nan=True) + "\n"


def write_records(
    path: str | os.PathLike[str], records: Iterable[BaseModel | Mapping[str, Any]]
) -> int:
    """Write the whole file atomically, one line per record; returns the count."""
    from art_langgraph.utils import atomic_write

    count = 0
    with atomic_write(path) as f:
        for record in records:
            f.write(_line(record))
            count += 1
    return count


def append_records(
    path: str | os.PathLike[str], records: Iterable[BaseModel | Mapping[str, Any]]
) -> int:
    """Append one line per record (creating the file and its folder), in one write, then
    flush and fsync; returns the count."""
    text = "".join(_line(r) for r in records)
    if not text:
        return 0
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a+b") as f:
        _cut_torn_tail(f, p)
        f.write(text.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    return text.count("\n")


def _cut_torn_tail(f: Any, path: Path) -> None:
    """Truncate the bytes after the last newline of `f` (opened "a+b"), when they are not a
    whole record: what a process killed mid-append leaves."""
    end = f.seek(0, os.SEEK_END)
    pos, tail = end, b""
    while pos > 0:
        step = min(_CHUNK, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            pos += cut + 1
            tail = chunk[cut + 1 :] + tail
            break
        tail = chunk + tail
    if not tail:
        return
    try:
        json.loads(tail)  # a whole record that only lacks its newline: keep it, end it
        f.write(b"\n")
    except ValueError:
        log.warning("cut a line torn by a crash from the end of %s (%d bytes)", path, len(tail))
        f.truncate(pos)


@overload
def read_records(
    path: str | os.PathLike[str],
    kind: None = None,
    *,
    missing_ok: bool = False,
    hint: Callable[[str], str] | None = None,
) -> list[dict[str, Any]]: ...
@overload
def read_records(
    path: str | os.PathLike[str],
    kind: type[_M],
    *,
    missing_ok: bool = False,
    hint: Callable[[str], str] | None = None,
) -> list[_M]: ...
def read_records(
    path: str | os.PathLike[str],
    kind: type[Any] | None = None,
    *,
    missing_ok: bool = False,
    hint: Callable[[str], str] | None = None,
) -> list[Any]:
    """Every record of the file, in order: a dict per line, or `kind` validated from it.
    Blank lines are skipped; so is a torn last line (see the module doc). `missing_ok`: a
    missing file is []; else FileNotFoundError. `hint(line)` adds to the error for a line
    that is not a record (what the file may hold instead)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return []
        raise
    lines = data.decode("utf-8").split("\n")
    last = lines.pop()  # "" when the file ends with a newline
    out: list[Any] = []
    for lineno, line in enumerate([*lines, last], 1):
        if not line.strip():
            continue
        try:
            record = kind.model_validate_json(line) if kind is not None else json.loads(line)
            if kind is None and not isinstance(record, dict):
                raise _NotAnObject(f"a JSON {type(record).__name__}, not an object")
        except (json.JSONDecodeError, ValidationError, _NotAnObject) as exc:
            # (an error a record's own validator raises, NonFiniteRewardError say, is the
            # record's, and goes up as it is)
            if lineno > len(lines):  # the last line, with no newline: torn by a crash
                log.warning("skipped a line torn by a crash at the end of %s", path)
                break
            what = kind.__name__ if kind is not None else "JSON object"
            extra = hint(line) if hint is not None else ""
            raise UsageError(f"{path}:{lineno}: not a valid {what}{extra}: {exc}") from exc
        out.append(record)
    return out
