"""Names that become folder names: a model's name and its project.

`check_path_name(value, what)` accepts 1 to 128 characters of ASCII letters, digits and
`. _ + -`, starting with a letter or a digit. That rules out `.` and `..`, hidden
folders, separators, NUL, whitespace and anything a filesystem could read as a path, so
`{path}/{project}/models/{name}` always stays inside `{path}`. `inference_name(name,
step)` spells the served name, `name`, `name@step` or `name@latest` (`LATEST`: the latest
step even when the bare name serves a promoted one, `backend/promotion.py`), and
`parse_inference_name` reads one back: the one place each is done.

Left out: unicode names (they would be safe as paths, but differ between filesystems'
normalization forms).
"""

from __future__ import annotations

import re

from art_langgraph.errors import UsageError

LATEST = "latest"
"""`name@latest` always names the latest step; the bare `name` may serve a promoted one."""

_PATH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


def check_path_name(value: str, what: str) -> str:
    """`value` if it is safe as one folder name; else a UsageError naming `what`."""
    if not isinstance(value, str) or not _PATH_NAME.fullmatch(value):
        raise UsageError(
            f"{what} {value!r} is not a valid name: use 1-128 ASCII letters, digits and '._+-', "
            "starting with a letter or digit (it becomes a folder name)"
        )
    return value


def inference_name(name: str, step: int | str | None = None) -> str:
    """The served name: `name` (latest step, or the promoted one), `name@step` (pinned) or
    `name@latest` (step `LATEST`)."""
    return name if step is None else f"{name}@{step}"


def parse_inference_name(served: str) -> tuple[str, int | str | None]:
    """`inference_name` read back: `name` -> (name, None), `name@latest` -> (name, LATEST),
    `name@12` -> (name, 12); any other text after the last '@' comes back as written (it
    names no step: the registry answers it as an unknown model)."""
    name, at, step = served.rpartition("@")
    if not at:
        return served, None
    if step.isascii() and step.isdigit():
        return name, int(step)
    return name, step
