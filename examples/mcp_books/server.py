"""A second small MCP server, for checking that the defaults are not tuned to the first:
book facts over stdio.

    python -m examples.mcp_books.server

Tools: `author(title)` (the author's name) and `year(title)` (the year of first
publication). The title's schema lists the 24 known books as an `enum`; another title is
a tool error. The task (tasks.py) is of the same size and kind as the bundled
capital/currency task (examples/mcp_server), with its own server, scenarios and reward:
it is trained with the defaults and nothing else (docs/results.md).
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

BOOKS = {
    "Bambi": ("Felix Salten", 1923),
    "Beloved": ("Toni Morrison", 1987),
    "Candide": ("Voltaire", 1759),
    "Carrie": ("Stephen King", 1974),
    "Coraline": ("Neil Gaiman", 2002),
    "Dracula": ("Bram Stoker", 1897),
    "Dune": ("Frank Herbert", 1965),
    "Emma": ("Jane Austen", 1815),
    "Faust": ("Johann Wolfgang von Goethe", 1808),
    "Frankenstein": ("Mary Shelley", 1818),
    "Hamlet": ("William Shakespeare", 1603),
    "Heidi": ("Johanna Spyri", 1881),
    "Ivanhoe": ("Walter Scott", 1819),
    "Kidnapped": ("Robert Louis Stevenson", 1886),
    "Lolita": ("Vladimir Nabokov", 1955),
    "Matilda": ("Roald Dahl", 1988),
    "Middlemarch": ("George Eliot", 1871),
    "Nostromo": ("Joseph Conrad", 1904),
    "Persuasion": ("Jane Austen", 1817),
    "Pinocchio": ("Carlo Collodi", 1883),
    "Siddhartha": ("Hermann Hesse", 1922),
    "Ulysses": ("James Joyce", 1922),
    "Utopia": ("Thomas More", 1516),
    "Walden": ("Henry David Thoreau", 1854),
}

server = MCPServer("book-facts", instructions="Facts about books.", log_level="WARNING")

Title = Annotated[str, Field(max_length=30, json_schema_extra={"enum": sorted(BOOKS)})]


def _book(title: str) -> tuple[str, int]:
    for name, facts in BOOKS.items():
        if name.lower() == title.strip().lower():
            return facts
    raise ToolError(f"unknown book: {title!r}")


@server.tool()
def author(title: Title) -> str:
    """Who wrote a book."""
    return _book(title)[0]


@server.tool()
def year(title: Title) -> int:
    """The year a book was first published."""
    return _book(title)[1]


if __name__ == "__main__":
    server.run()
