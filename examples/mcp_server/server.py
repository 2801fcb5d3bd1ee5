"""A small MCP server: arithmetic and country-facts lookups, over stdio (or in-process).

    python -m examples.mcp_server.server          # serve over stdio
    ART_MCP_TEST_TOOLS=1 python -m ...            # (tests) also `wait` and `crash`

Tools: `add(a, b)`, `multiply(a, b)`, `capital(country)` and `currency(country)`.
The country's schema lists the 24 known countries as an `enum`, so a client that
decodes under the schema can only name a known one (and a small model picks one of
24 instead of spelling a name letter by letter); a client that ignores the schema
and sends another name gets a tool error. With ART_MCP_TEST_TOOLS set, also `wait(seconds)` (timeouts) and `crash()`
(kills the process, so tests can check that a crashed server is restarted).
Resources: `facts://countries`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

CAPITALS = {
    "brazil": "Brasilia",
    "canada": "Ottawa",
    "chile": "Santiago",
    "china": "Beijing",
    "cuba": "Havana",
    "egypt": "Cairo",
    "france": "Paris",
    "ghana": "Accra",
    "hungary": "Budapest",
    "indonesia": "Jakarta",
    "italy": "Rome",
    "japan": "Tokyo",
    "kenya": "Nairobi",
    "morocco": "Rabat",
    "nigeria": "Abuja",
    "norway": "Oslo",
    "peru": "Lima",
    "poland": "Warsaw",
    "russia": "Moscow",
    "spain": "Madrid",
    "sweden": "Stockholm",
    "thailand": "Bangkok",
    "turkey": "Ankara",
    "vietnam": "Hanoi",
}
CURRENCIES = {
    "brazil": "real",
    "canada": "dollar",
    "chile": "peso",
    "china": "yuan",
    "cuba": "peso",
    "egypt": "pound",
    "france": "euro",
    "ghana": "cedi",
    "hungary": "forint",
    "indonesia": "rupiah",
    "italy": "euro",
    "japan": "yen",
    "kenya": "shilling",
    "morocco": "dirham",
    "nigeria": "naira",
    "norway": "krone",
    "peru": "sol",
    "poland": "zloty",
    "russia": "ruble",
    "spain": "euro",
    "sweden": "krona",
    "thailand": "baht",
    "turkey": "lira",
    "vietnam": "dong",
}

server = MCPServer("arith-facts", instructions="Arithmetic and country facts.", log_level="WARNING")

Small = Annotated[int, Field(ge=0, le=999)]
# The enum is advertised, not validated by pydantic: an unknown name reaches the function,
# whose error says what was wrong.
Country = Annotated[
    str,
    Field(max_length=20, json_schema_extra={"enum": [c.title() for c in sorted(CAPITALS)]}),
]


@server.tool()
def add(a: Small, b: Small) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def multiply(a: Small, b: Small) -> int:
    """Multiply two integers."""
    return a * b


@server.tool()
def capital(country: Country) -> str:
    """The capital city of a country."""
    try:
        return CAPITALS[country.strip().lower()]
    except KeyError:
        raise ToolError(f"unknown country: {country!r}") from None


@server.tool()
def currency(country: Country) -> str:
    """The currency of a country."""
    try:
        return CURRENCIES[country.strip().lower()]
    except KeyError:
        raise ToolError(f"unknown country: {country!r}") from None


async def wait(seconds: Annotated[float, Field(ge=0, le=10)]) -> str:
    """Wait, then say so (lets tests exercise timeouts)."""
    await asyncio.sleep(seconds)
    return f"waited {seconds} s"


def crash() -> str:
    """Exit the server process (used by tests)."""
    os._exit(3)


if os.environ.get("ART_MCP_TEST_TOOLS"):  # tools for the tests only: the agent never sees them
    server.tool()(wait)
    server.tool()(crash)


@server.resource("facts://countries")
def countries() -> str:
    """The countries `capital` knows."""
    return ", ".join(sorted(c.title() for c in CAPITALS))


if __name__ == "__main__":
    server.run()
