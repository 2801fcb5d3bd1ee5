"""A model's folder: `CheckpointFolder` reads it from any process and changes nothing;
`CheckpointStore`, the trainer's, tidies it when opened. Real folders on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_langgraph.backend.checkpoints import CheckpointFolder, CheckpointStore
from art_langgraph.errors import UsageError


def _folder(tmp_path: Path) -> Path:
    """Steps 1 and 2 complete (2 names its base model), a half-written temp folder, and a
    step folder whose marker is torn."""
    root = tmp_path / "models" / "m"
    for step, meta in ((1, {"step": 1}), (2, {"step": 2, "base_model": "smollm2-135m"})):
        (root / "checkpoints" / f"{step:04d}").mkdir(parents=True)
        (root / "checkpoints" / f"{step:04d}" / "checkpoint.json").write_text(json.dumps(meta))
    (root / "checkpoints" / ".tmp-0003-abcd").mkdir()
    (root / "checkpoints" / "0003").mkdir()
    (root / "checkpoints" / "0003" / "checkpoint.json").write_text('{"step": 3, "met')
    return root


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_reading_a_folder_changes_nothing(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    before = _listing(root)
    folder = CheckpointFolder(root)
    assert folder.steps() == [1, 2] and folder.latest() == 2
    assert folder.meta(2)["base_model"] == "smollm2-135m" == folder.base_model()
    assert CheckpointFolder(root).steps() == [1, 2]
    with pytest.raises(UsageError, match="no complete checkpoint for step 3"):
        folder.meta(3)
    with pytest.raises(UsageError, match="outside the model's folder"):
        folder._inside(root.parent)
    assert _listing(root) == before  # nothing removed, renamed or created
    missing = CheckpointFolder(tmp_path / "nowhere")
    assert missing.steps() == [] and missing.base_model() is None
    assert not (tmp_path / "nowhere").exists()


def test_the_trainers_store_tidies_the_folder_when_opened(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    store = CheckpointStore(root)
    assert store.steps() == [1, 2]
    names = sorted(p.name for p in (root / "checkpoints").iterdir())
    assert names[:2] == ["0001", "0002"] and names[2].startswith("0003.invalid-")
    assert len(names) == 3 and store.swept == [names[2]]  # the temp folder is gone
