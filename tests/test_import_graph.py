"""No import circles in art_langgraph and art_mcp, type-only ones included.

Every `import` and `from ... import` counts, wherever it is: at the top, inside a
function, under `if TYPE_CHECKING:`. A circle there is still a design smell (two modules
that each need the other), and a function-level import is a circle waiting for someone
to hoist it. Edges go to the module named (`from pkg import mod` to `pkg.mod` when `mod`
is a module, else to `pkg`); the parents a Python import also runs are not counted, or
every package `__init__` that re-exports would close a circle with its own modules.
Left out: imports built from strings (`importlib.import_module`, the lazy `__getattr__`).

Run it alone to print the graph's circles: `python tests/test_import_graph.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("art_langgraph", "art_mcp")

ALLOWED: set[frozenset[str]] = set()
"""Pairs of modules allowed to import each other: none."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of PACKAGES it imports (anywhere in its file)."""
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from .x import y
                    parent = package[: len(package) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in files:  # a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    graph = import_graph()
    bad = [c for c in circles(graph) if frozenset(c) not in ALLOWED]
    lines = [
        f"{' <-> '.join(c)}: " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
        for c in bad
    ]
    assert not bad, "import circles:\n" + "\n".join(lines)


def test_the_walk_finds_circles_and_type_only_imports() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    # model.py imports backend.base at the top; backend.base imports training.config
    # only under TYPE_CHECKING: both edges are seen.
    assert "art_langgraph.backend.base" in graph["art_langgraph.model"]
    assert "art_langgraph.training.config" in graph["art_langgraph.backend.base"]
    assert "art_langgraph.model" not in graph["art_langgraph.backend.base"]


if __name__ == "__main__":
    g = import_graph()
    for c in circles(g):
        print(" <-> ".join(c), "(allowed)" if frozenset(c) in ALLOWED else "")
