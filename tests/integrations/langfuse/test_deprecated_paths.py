"""The flat Langfuse modules of 0.1 still import, warn, and give the package's own objects.

`integrations.langfuse_datasets`, `langfuse_review` and `langfuse_scoring` moved into the
`integrations.langfuse` package; so did the old single module's public names outside its
`__all__`. Each old path warns once per import (DeprecationWarning) until 0.2.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import art_langgraph.integrations.langfuse as lf

OLD_MODULES = {
    "art_langgraph.integrations.langfuse_datasets": [
        "art_langgraph.integrations.langfuse.datasets"
    ],
    "art_langgraph.integrations.langfuse_scoring": ["art_langgraph.integrations.langfuse.scoring"],
    "art_langgraph.integrations.langfuse_review": [
        "art_langgraph.integrations.langfuse.annotation",
        "art_langgraph.integrations.langfuse.review",
        "art_langgraph.integrations.langfuse.sft",
    ],
}


@pytest.mark.parametrize("old", sorted(OLD_MODULES))
def test_an_old_module_warns_and_gives_the_same_objects(old: str) -> None:
    sys.modules.pop(old, None)  # a module warns when it is first imported
    with pytest.warns(DeprecationWarning, match=r"moved to art_langgraph\.integrations\.langfuse"):
        shim = importlib.import_module(old)
    homes = [importlib.import_module(m) for m in OLD_MODULES[old]]
    assert shim.__all__
    for name in shim.__all__:
        home = next(h for h in homes if name in h.__all__)
        assert getattr(shim, name) is getattr(home, name), name


def test_the_package_keeps_the_old_module_names_without_a_warning() -> None:
    assert lf.__all__ == [
        "ExportReport",
        "LangfuseConfig",
        "LangfuseLogger",
        "ReviewResult",
        "approved_sft_file",
        "export_folder",
        "import_scores",
        "trace_id_for",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in lf.__all__:
            assert getattr(lf, name) is not None


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("EXPORTS_FILE", "folder"),
        ("OTLP_PATH", "sender"),
        ("SCOPE", "traces"),
        ("ReviewedScore", "review"),
        ("fetch_scores", "review"),
        ("score_bodies", "traces"),
    ],
)
def test_the_old_module_other_public_names_warn_and_resolve(name: str, home: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"moved to {lf.__name__}\.{home}"):
        got = getattr(lf, name)
    assert got is getattr(importlib.import_module(f"{lf.__name__}.{home}"), name)
    with pytest.raises(AttributeError):
        lf.no_such_name  # noqa: B018
