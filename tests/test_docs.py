"""The docs: the config tables of docs/configuration.md are generated from the config classes
and must be current; the API reference covers every public name; the README's links resolve.

The site itself (every page, link and anchor) is checked by `mkdocs build --strict` in
scripts/test.sh."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_config_tables_are_current() -> None:
    out = subprocess.run(
        [sys.executable, "scripts/docs.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def test_every_config_field_is_documented() -> None:
    from art_langgraph.training.config import ModelConfig, TrainConfig

    for cls in (TrainConfig, ModelConfig):
        for name, field in cls.model_fields.items():
            assert field.description and len(field.description) > 10, f"{cls.__name__}.{name}"


def test_the_api_reference_names_every_public_name() -> None:
    """A name added to `__all__` gets a place in the API reference, or this fails."""
    import art_langgraph
    import art_mcp

    pages = {
        art_langgraph: (ROOT / "docs/api/art_langgraph.md").read_text(),
        art_mcp: (ROOT / "docs/api/art_mcp.md").read_text(),
    }
    for package, page in pages.items():
        if re.search(
            rf"^::: {package.__name__}\n(?!    options:\n(      .*\n)*      members: false)",
            page,
            re.M,
        ):
            continue  # the whole package is rendered, so all of __all__ is
        documented = set(re.findall(rf"^::: {package.__name__}\.(?:\w+\.)*?(\w+)$", page, re.M))
        special = {"__version__", "rewards"}  # a string; a module with a page of its own
        missing = set(package.__all__) - documented - special
        assert not missing, f"docs/api/{package.__name__}.md lacks {sorted(missing)}"


def test_the_readme_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if target.startswith(("http://", "https://", "#")):
            continue
        path = target.split("#", 1)[0]
        assert (ROOT / path).exists(), f"README links to {target}, which does not exist"


def test_every_marker_block_rewrites_in_place(tmp_path: Path) -> None:
    """Writing each block's own text back leaves its page unchanged: markers come in
    well-formed pairs, and none hides in the prose (where a benchmark would overwrite it)."""
    from bench.readme import PAGES, update_docs

    for page in PAGES:
        copy = tmp_path / page.name
        body = page.read_text()
        copy.write_text(body)
        for kind, name in re.findall(r"<!-- (bench|config):([\w.-]+):start -->", body):
            start, end = f"<!-- {kind}:{name}:start -->", f"<!-- {kind}:{name}:end -->"
            assert body.count(start) == 1 and body.count(end) == 1, f"{page.name}: {name}"
            block = body.split(start, 1)[1].split(end, 1)[0]
            assert update_docs(name, block, copy, kind=kind)
        assert copy.read_text() == body, f"{page.name}: a marker block is malformed"


def _packages() -> set[str]:
    """Every package folder of art_langgraph and art_mcp, as `art_langgraph/backend/api/`."""
    return {
        f"{init.parent.relative_to(ROOT).as_posix()}/"
        for pkg in ("art_langgraph", "art_mcp")
        for init in (ROOT / pkg).rglob("__init__.py")
    }


def test_the_package_diagram_matches_the_code() -> None:
    """docs/concepts.md draws every package once, and only modules that exist in it."""
    page = (ROOT / "docs/concepts.md").read_text()
    [diagram] = re.findall(r"```mermaid\n(.*?)```", page, re.S)
    # A node: id["art_langgraph/serving/<br/>app.py, chat_service.py"]
    nodes = re.findall(
        r'^\s*\w+\["((?:art_langgraph|art_mcp)/(?:\w+/)*)(?:<br/>)?([^"]*)"\]', diagram, re.M
    )
    drawn = [folder for folder, _ in nodes]
    assert len(drawn) == len(set(drawn)), f"a package drawn twice: {sorted(drawn)}"
    real = _packages()
    assert not set(drawn) - real, (
        f"the diagram draws packages that do not exist: {sorted(set(drawn) - real)}"
    )
    assert not real - set(drawn), f"the diagram misses packages: {sorted(real - set(drawn))}"
    for folder, label in nodes:
        for module in re.findall(r"(\w+)\.py", label):
            assert (ROOT / folder / f"{module}.py").is_file(), (
                f"{folder}{module}.py is not a module"
            )


def test_publish_prints_saves_and_leaves_pages_without_markers_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.readme import PAGES, publish

    before = {page: page.read_text() for page in PAGES if page.exists()}
    publish(
        "no_such_block", tmp_path / "r.json", ["| a |", "|---|"], argparse.Namespace(n=3), rows=[1]
    )
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["args"] == {"n": 3} and saved["rows"] == [1]
    assert saved["table"] == ["| a |", "|---|"] and set(saved["host"]) == {"cpu_flags", "machine"}
    assert capsys.readouterr().out == "| a |\n|---|\n"
    assert {page: page.read_text() for page in PAGES if page.exists()} == before
