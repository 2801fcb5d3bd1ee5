"""bench/'s layout (bench/README.md): every benchmark and probe is named in the docs, and the
docs name none that is gone; every result sits in its benchmark's folder and says which
commit it came from."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
SHARED = {"__init__", "readme", "memory", "sweep"}
"""Modules of bench/ that are no benchmark."""
OTHER_FOLDERS = {"misc"}
"""Folders of bench/results/ named after no benchmark: hand-made runs no script wrote."""


def _benchmarks() -> set[str]:
    """Every benchmark's module, as `python -m` takes it: bench.NAME, bench.probes.NAME."""
    found = set()
    for package, folder in (("bench", BENCH), ("bench.probes", BENCH / "probes")):
        found |= {f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem not in SHARED}
        found |= {f"{package}.{p.parent.name}" for p in folder.glob("*/__main__.py")}
    return found


def _pages() -> dict[str, str]:
    return {
        p.relative_to(ROOT).as_posix(): p.read_text()
        for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    }


def test_every_benchmark_is_named_in_the_docs_and_every_named_one_exists() -> None:
    benchmarks = _benchmarks()
    assert "bench.learning" in benchmarks and "bench.probes.engine_kv" in benchmarks
    assert "bench.rl_step" in benchmarks
    text = "\n".join(_pages().values())
    unnamed = {b for b in benchmarks if not re.search(rf"\b{re.escape(b)}\b", text)}
    assert not unnamed, f"no docs page names {sorted(unnamed)} (docs/benchmarks.md: a section)"
    for page, body in _pages().items():
        for name in re.findall(r"\bbench\.((?:probes\.)?[a-z0-9_]+)", body):
            if name == "probes" or f"bench.{name}" in benchmarks or name in SHARED:
                continue
            raise AssertionError(f"{page} names bench.{name}, which is no module of bench/")


def _misplaced(results: Path, benchmarks: set[str]) -> list[str]:
    """Files of `results` that are not in a benchmark's folder (bench/results/NAME/...),
    and result files that record no commit."""
    names = {b.rsplit(".", 1)[1] for b in benchmarks} | OTHER_FOLDERS
    problems = []
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        rel = path.relative_to(results)
        if len(rel.parts) == 1:
            problems.append(f"{rel}: directly in bench/results/, not in its benchmark's folder")
        elif rel.parts[0] not in names:
            problems.append(f"{rel}: {rel.parts[0]}/ is named after no benchmark")
        elif path.suffix == ".json" and not {"commit", "commit_added"} & set(
            json.loads(path.read_text())
        ):
            problems.append(f"{rel}: neither commit nor commit_added")
    return problems


def test_every_result_sits_in_its_benchmarks_folder_with_its_commit() -> None:
    assert RESULTS.is_dir() and any(RESULTS.rglob("*.json"))
    assert not _misplaced(RESULTS, _benchmarks())


def test_a_result_dropped_flat_or_without_a_commit_is_caught(tmp_path: Path) -> None:
    (tmp_path / "branch").mkdir()
    (tmp_path / "branch" / "branch.json").write_text('{"commit": "abc", "rows": []}')
    (tmp_path / "misc").mkdir()
    (tmp_path / "misc" / "probe.json").write_text('{"commit_added": "abc"}')
    assert not _misplaced(tmp_path, {"bench.branch"})
    (tmp_path / "branch.json").write_text('{"commit": "abc"}')
    (tmp_path / "nobody").mkdir()
    (tmp_path / "nobody" / "x.json").write_text('{"commit": "abc"}')
    (tmp_path / "branch" / "old.json").write_text('{"rows": []}')
    assert set(_misplaced(tmp_path, {"bench.branch"})) == {
        "branch.json: directly in bench/results/, not in its benchmark's folder",
        "branch/old.json: neither commit nor commit_added",
        "nobody/x.json: nobody/ is named after no benchmark",
    }


def test_a_saved_result_opens_with_its_commit_unless_it_has_its_own(tmp_path: Path) -> None:
    from bench.readme import write_results

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    write_results(tmp_path / "new.json", {"rows": [1]})
    saved = json.loads((tmp_path / "new.json").read_text())
    assert list(saved) == ["commit", "dirty", "rows"]
    assert saved["commit"] == head and isinstance(saved["dirty"], bool)
    write_results(tmp_path / "own.json", {"commit": "1561a56", "rows": [1]})
    assert json.loads((tmp_path / "own.json").read_text()) == {"commit": "1561a56", "rows": [1]}
