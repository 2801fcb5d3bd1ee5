"""Where a benchmark saves its results, and how its latest table gets into the docs,
between its two marker comments.

    <!-- bench:NAME:start --> ... <!-- bench:NAME:end -->

A benchmark keeps its JSON under `results_dir(NAME)` (bench/results/NAME/, NAME being its
module's name) and saves it with `write_results`, which stamps the commit checked out and
whether the code had uncommitted changes. Every benchmark calls `update_docs(NAME, text)`
after saving its JSON, so the docs always show the last measured table; `publish` does the
three steps a table-printing benchmark ends with (print the table, save the JSON with the
date, host and arguments, update the docs). The markers live in `docs/benchmarks.md` and
`docs/results.md` (and the config tables' markers, `kind="config"`, in
`docs/configuration.md`, which `scripts/docs.py` fills); the first page that holds a
block's markers gets the text. Left out: anything but the text between markers, and which
code a result came from beyond its commit (a dirty run's diff is not kept).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

# art_langgraph (atomic_write) is imported where a file is written, so a child process that
# measures its own memory imports `results_dir` for nothing

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
RESULTS = ROOT / "docs" / "results.md"
RESULTS_HISTORY = ROOT / "docs" / "results-history.md"
BFCL = ROOT / "docs" / "bfcl.md"
PAGES = (BENCHMARKS, CONFIGURATION, RESULTS, RESULTS_HISTORY, BFCL, README)
"""Where marker blocks are looked for, in this order."""


CODE = ("art_langgraph", "art_mcp", "bench", "examples", ":(exclude)bench/results")
"""The paths whose uncommitted changes make a result `dirty`: the code, not its results."""


def child_or_args(
    ap: argparse.ArgumentParser, arms: list[str], results: Path, child: Any
) -> argparse.Namespace | None:
    """A probe's command line, with the two flags every arms-in-child-processes probe has:
    `--only ARM` (the child: runs `child(ARM, args)` and prints its result as JSON, then
    None is returned) and `--out` (where the results go, `results` by default)."""
    ap.add_argument("--only", choices=arms, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(results))
    args = ap.parse_args()
    if args.only:
        print(json.dumps(child(args.only, args)))
        return None
    return args


def alternate_arms(
    module: str, arms: list[str], repeats: int, flags: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """Run `python -m module --only ARM *flags` for each arm in turn, `repeats` rounds (the
    arms alternating, so drift hits them alike), each in a process of its own; each child
    prints its result as JSON on its last line. Returns every arm's results in order."""
    import sys

    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for _ in range(repeats):
        for arm in arms:
            cmd = [sys.executable, "-m", module, "--only", arm, *flags]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def results_dir(name: str) -> Path:
    """The folder of benchmark `name`'s results (its module's name: `learning_bfcl`, or
    `engine_kv` for bench/probes/engine_kv.py): bench/results/NAME/."""
    return ROOT / "bench" / "results" / name


def _read_code_state() -> tuple[str | None, bool | None]:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", *CODE],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    if head.returncode or status.returncode:
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip())


_AT_START = _read_code_state()  # when the benchmark's process imports this module


def code_state() -> tuple[str | None, bool | None]:
    """The commit checked out in ROOT (full sha) and whether `CODE` had uncommitted
    changes when this process started its benchmark (imported this module): the code it
    runs, even when a save comes hours later, after a commit or an edit; (None, None)
    without git or outside a checkout."""
    return _AT_START


def write_results(path: Path, data: dict) -> None:
    """Save a benchmark's results as JSON, atomically (temp file in the same folder, then
    rename), opening with the run's `commit` and `dirty` (`code_state`) unless `data` has a
    `commit` of its own (a BFCL run's result.json records the commit it ran)."""
    from art_langgraph.utils import atomic_write

    if "commit" not in data:
        commit, dirty = code_state()
        data = {"commit": commit, "dirty": dirty, **data}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def update_docs(name: str, text: str, page: Path | None = None, kind: str = "bench") -> bool:
    """Replace the block for `name` in `page` (None: the first of `PAGES` that has its
    markers); returns False when no page has markers for it."""
    from art_langgraph.utils import atomic_write

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
