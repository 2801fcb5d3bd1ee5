"""No module of art_langgraph or art_mcp is over `MAX_LINES` lines: past that a module holds
more than one concept (STYLE.md), and the next change should split it by concept, not in
halves that import each other."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600


def test_no_module_is_over_the_limit() -> None:
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for package in ("art_langgraph", "art_mcp")
        for p in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 100  # the walk found the packages
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines: {over}"
