"""The BFCL side, from the project's environment: BFCL's items and verdicts, asked of
`checker_service.py` running in BFCL's own environment (`.venv-bfcl`).

`BfclChecker()` starts the service (one child process, fed on stdin; it exits when the pipe
closes, so it never outlives us); `items(category)` returns BFCL's items with their ground
truth; `check(item, calls)` returns BFCL's verdict on the tool calls a model made. Nothing
here judges a call: every pass and fail is BFCL's `ast_checker`.

The environment comes from `scripts/setup-bfcl.sh`; `ART_BFCL_VENV` points elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVICE = Path(__file__).with_name("checker_service.py")
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
"""BFCL v4's non-live single-turn Python categories: the ones this example trains and scores."""
WHOLE_ONLY = ("simple_java", "simple_javascript")
"""The other non-live categories of BFCL's overall: scored whole, never split or trained on."""


def bfcl_python() -> Path:
    """The interpreter of BFCL's environment; a clear error when it was never made."""
    venv = Path(os.environ.get("ART_BFCL_VENV", ROOT / ".venv-bfcl"))
    python = venv / "bin" / "python"
    if not python.is_file():
        raise FileNotFoundError(
            f"BFCL's environment is not at {venv}: run ./scripts/setup-bfcl.sh (it installs "
            "bfcl-eval there, apart from the project's environment)"
        )
    return python


class BfclChecker:
    """A running checker service. Thread-safe; `close()` (or `with`) stops it."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [str(bfcl_python()), str(SERVICE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        self._items: dict[str, list[dict[str, Any]]] = {}

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            if self._proc.poll() is not None:
                raise RuntimeError(f"BFCL's checker service exited ({self._proc.returncode})")
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"BFCL's checker service exited ({self._proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        if "failure" in reply:
            raise RuntimeError(f"BFCL's checker service: {reply['failure']}")
        return reply

    def items(self, category: str) -> list[dict[str, Any]]:
        """BFCL's items of `category` (`id`, `question`, `function`, and `ground_truth`
        except for irrelevance), read once."""
        if category not in self._items:
            self._items[category] = self._ask({"op": "items", "category": category})["items"]
        return self._items[category]

    def check(self, item: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
        """BFCL's verdict on `calls` (`[{function_name: {arg: value}}]`, names as BFCL's
        `convert_to_tool` gave them to the model) for `item`."""
        category = item["id"].rsplit("_", 1)[0]
        return self._ask(
            {
                "op": "check",
                "category": category,
                "function": item["function"],
                "ground_truth": item.get("ground_truth"),
                "output": calls,
            }
        )

    def overall(self, scores: dict[str, dict[str, float]]) -> dict[str, float]:
        """BFCL's non-live overall (`simple` and `non_live`) from per-category `accuracy`
        and `total_count`, computed by BFCL's own code."""
        reply = self._ask({"op": "overall", "scores": scores})
        return {"simple": reply["simple"], "non_live": reply["non_live"]}

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def __enter__(self) -> BfclChecker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
