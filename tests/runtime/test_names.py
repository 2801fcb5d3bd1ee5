"""Model and project names are single folder names: nothing can climb out of `models/`."""

from __future__ import annotations

import pytest

import art_langgraph as art
from art_langgraph.errors import UsageError
from art_langgraph.runtime.names import (
    LATEST,
    check_path_name,
    inference_name,
    parse_inference_name,
)

BAD = [
    ".",
    "..",
    "",
    " ",
    "a b",
    "a/b",
    "a\\b",
    "a\x00b",
    "\x00",
    ".hidden",
    "-x",
    "a@1",
    "é",
    "x" * 129,
    "a\n",
]


@pytest.mark.parametrize("bad", BAD)
def test_bad_names_are_refused_for_models_and_projects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a valid name"):
        art.TrainableModel(name=bad, project="p", base_model="tiny")
    with pytest.raises(ValueError, match="not a valid name"):
        art.TrainableModel(name="m", project=bad, base_model="tiny")


@pytest.mark.parametrize("good", ["m", "agent-123456", "Qwen2.5-7B_lora+v2", "a" * 128])
def test_good_names_pass(good: str) -> None:
    assert check_path_name(good, "model name") == good
    assert inference_name(good) == good
    assert inference_name(good, 3) == f"{good}@3"


async def test_a_name_reassigned_after_construction_is_refused_at_register(tmp_path) -> None:
    model = art.TrainableModel(name="m", project="p", base_model="tiny")
    model.name = ".."
    backend = art.LocalBackend(path=str(tmp_path / "art"))
    with pytest.raises(UsageError, match="not a valid name"):
        await model.register(backend)
    await backend.close()
    assert not (tmp_path / "art").exists() or not any((tmp_path / "art").rglob("*.json"))


@pytest.mark.parametrize(
    ("served", "parsed"),
    [
        ("agent", ("agent", None)),
        ("agent@12", ("agent", 12)),
        ("agent@latest", ("agent", LATEST)),
        ("agent@0", ("agent", 0)),
        ("agent@-1", ("agent", "-1")),  # names no step
        ("agent@١", ("agent", "١")),  # a non-ASCII digit names no step
        ("agent@", ("agent", "")),
    ],
)
def test_a_served_name_reads_back_as_inference_name_spelled_it(
    served: str, parsed: tuple[str, int | str | None]
) -> None:
    assert parse_inference_name(served) == parsed
    name, step = parsed
    if step is None or isinstance(step, int) or step == LATEST:
        assert inference_name(name, step) == served
