"""A small MCP server: arithmetic and a country-facts lookup, over stdio (or in-process).

    python -m examples.mcp_server.server          # serve over stdio
    ART_MCP_CRASH_ON=crash python -m ...          # (tests) exit when the `crash` tool is called

Tools: `add(a, b)`, `multiply(a, b)`, `capital(country)` (an error for unknown
countries), `wait(seconds)`, and `crash()` which kills the process when ART_MCP_CRASH_ON is set, so tests
can check that a crashed server is restarted. Resources: `facts://countries`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

CAPITALS = {
    "france": "Paris",
    "italy": "Rome",
    "norway": "Oslo",
    "peru": "Lima",
    "japan": "Tokyo",
    "kenya": "Nairobi",
}

server = MCPServer("arith-facts", instructions="Arithmetic and country facts.", log_level="WARNING")

Small = Annotated[int, Field(ge=0, le=999)]


@server.tool()
def add(a: Small, b: Small) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def multiply(a: Small, b: Small) -> int:
    """Multiply two integers."""
    return a * b


@server.tool()
def capital(country: Annotated[str, Field(max_length=20)]) -> str:
    """The capital city of a country."""
    try:
        return CAPITALS[country.strip().lower()]
    except KeyError:
        raise ToolError(f"unknown country: {country!r}") from None


@server.tool()
async def wait(seconds: Annotated[float, Field(ge=0, le=10)]) -> str:
    """Wait, then say so (lets tests exercise timeouts)."""
    await asyncio.sleep(seconds)
    return f"waited {seconds} s"


@server.tool()
def crash() -> str:
    """Exit the server process (only when ART_MCP_CRASH_ON is set; used by tests)."""
    if os.environ.get("ART_MCP_CRASH_ON"):
        os._exit(3)
    return "not crashing"


@server.resource("facts://countries")
def countries() -> str:
    """The countries `capital` knows."""
    return ", ".join(sorted(c.title() for c in CAPITALS))


if __name__ == "__main__":
    server.run()
