"""Layers that import one way, and no import circles, in art_langgraph and art_mcp.

**Layers.** Each package of art_langgraph (a subpackage, or a top-level module) sits in one
layer of `LAYERS`, and imports only from its own layer and the layers below it; art_mcp,
built on art_langgraph, is the top layer. `python -m pytest tests/test_import_graph.py -v`
names each layer as its test passes. A new package must be placed in a layer here.

**Circles.** No module imports another that imports it back, within a layer too.

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

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("art_langgraph", "art_mcp")

ALLOWED: set[frozenset[str]] = set()
"""Pairs of modules allowed to import each other: none."""

LAYERS: list[tuple[str, frozenset[str]]] = [
    ("base", frozenset({"errors", "utils", "runtime"})),  # errors, ART's helpers, plumbing
    ("trajectories", frozenset({"trajectories"})),  # the records a run leaves, and loggers
    ("presets", frozenset({"presets"})),  # the offline models
    ("chat", frozenset({"chat"})),  # messages and tools <-> token ids, by chat template
    ("engine", frozenset({"engine"})),  # token ids in, token ids out
    ("serving", frozenset({"serving"})),  # the OpenAI-compatible server over an engine
    ("training", frozenset({"training"})),  # GRPO: groups -> sequences -> a LoRA step
    ("scaleout", frozenset({"scaleout"})),  # several engines and trainer ranks, Ray
    ("backend", frozenset({"backend"})),  # the Backend contract, local and remote
    (
        "agent",  # the LangGraph / OpenAI plugin: models, capture, rollouts, rewards
        frozenset({"model", "tracing", "gathering", "rewards", "review_page"}),
    ),
    ("integrations", frozenset({"integrations"})),  # Langfuse, W&B
    ("entry", frozenset({"art_langgraph", "cli"})),  # the package's root and its CLI
    ("art_mcp", frozenset({"art_mcp"})),  # the MCP harness, built on all of the above
]
"""Layers, lowest first: a package imports from its own layer and those below only."""


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


def package_of(module: str) -> str:
    """The unit `LAYERS` places: art_mcp whole; in art_langgraph the subpackage or
    top-level module (`art_langgraph.engine.base` -> `engine`), the root itself as
    `art_langgraph`."""
    parts = module.split(".")
    if parts[0] == "art_mcp":
        return "art_mcp"
    return parts[1] if len(parts) > 1 else "art_langgraph"


def layer_of(package: str) -> int:
    found = [i for i, (_, members) in enumerate(LAYERS) if package in members]
    assert len(found) == 1, f"{package!r} must be in exactly one of LAYERS (found {found})"
    return found[0]


def test_every_package_has_a_layer() -> None:
    packages = {package_of(m) for m in import_graph()}
    for package in packages:
        layer_of(package)
    placed = set().union(*(members for _, members in LAYERS))
    assert not placed - packages, f"LAYERS names packages that do not exist: {placed - packages}"


def upward_imports(graph: dict[str, set[str]], index: int) -> list[str]:
    """The imports of layer `index`'s modules that reach a layer above it."""
    members = LAYERS[index][1]
    return sorted(
        f"{module} imports {target} ({LAYERS[layer_of(package_of(target))][0]})"
        for module, targets in graph.items()
        if package_of(module) in members
        for target in targets
        if layer_of(package_of(target)) > index
    )


@pytest.mark.parametrize("index", range(len(LAYERS)), ids=[name for name, _ in LAYERS])
def test_a_layer_imports_only_itself_and_the_layers_below(index: int) -> None:
    upward = upward_imports(import_graph(), index)
    assert not upward, f"layer {LAYERS[index][0]!r} imports from above it:\n" + "\n".join(upward)


def test_the_layer_rule_flags_an_upward_import_and_passes_a_downward_one() -> None:
    engine = layer_of("engine")
    graph = {
        "art_langgraph.engine.x": {"art_langgraph.training.trainer", "art_langgraph.errors"},
        "art_langgraph.training.trainer": {"art_langgraph.engine.base"},
    }
    assert upward_imports(graph, engine) == [
        "art_langgraph.engine.x imports art_langgraph.training.trainer (training)"
    ]
    assert upward_imports(graph, layer_of("training")) == []
    assert package_of("art_langgraph") == "art_langgraph"
    assert package_of("art_mcp.harness") == "art_mcp"


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
    for i, (layer, members) in enumerate(LAYERS):
        print(f"{i:2d} {layer}: {', '.join(sorted(members))}")
    for c in circles(g):
        print(" <-> ".join(c), "(allowed)" if frozenset(c) in ALLOWED else "")


def test_the_docs_layer_table_is_this_one() -> None:
    """docs/concepts.md's table of layers names the layers of `LAYERS`, in order, each with
    its packages of art_langgraph (the entry and art_mcp rows are prose)."""
    import re

    page = (ROOT / "docs" / "concepts.md").read_text()
    head = page.index("| layer | packages |")
    rows = re.findall(r"^\| (\w+) \| (.*) \|$", page[head:].split("\n\n")[0], re.M)[1:]
    assert [name for name, _ in rows] == [name for name, _ in LAYERS]
    for (name, cell), (_, packages) in zip(rows, LAYERS, strict=True):
        if name in ("entry", "art_mcp"):
            continue
        named = {p.rstrip("/") for p in re.findall(r"`([\w/]+)`", cell)}
        assert named == set(packages), f"layer {name}: the docs say {sorted(named)}"
