"""A tool call's identity across a rollout: its name and arguments, the arguments parsed
where they are a JSON string, so key order and spacing do not count. What the MCP
harness's repeat rules (`art_mcp.agent`) and the trainer's `repeated_calls` compare.

Left out: which calls repeat (each reader walks its own record: the harness the agent's
messages or tool events, the trainer the calls' response messages).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any


def tool_call_key(name: str | None, args: Any) -> str:
    """One tool call's identity, for spotting a call repeated in a rollout."""
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):  # else compared as written
            args = json.loads(args)
    return json.dumps([name, args], sort_keys=True, default=str)
