"""An org-chart MCP server over stdio: the two-hop task's server.

    python -m examples.mcp_org.server

One tool, `lookup(person, field)`: one fact about one person of a fictional company, their
extension, office, team or manager. A manager is another person of the company, so a
question about someone's manager takes two dependent lookups: the manager's name first,
then the fact about them, whose `person` argument comes from the first result. The people
and facts are generated from a fixed seed (`org()`), so no model knows them. An unknown
person or field is a tool error that says so. Results are plain labelled facts, with no
hint of what to do next: deciding that is the agent's job.

The people are split in two, as the staff directory's are (`examples/mcp_directory`):
held-out people take both names from name halves training never uses, and their managers
are held-out people too, so a held-out question's every entity is new. The scenarios and
reward live in `examples.mcp_org.tasks`.
"""

from __future__ import annotations

import functools
import random
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from examples.mcp_directory.server import FIRST_HELD, FIRST_TRAIN, LAST_HELD, LAST_TRAIN, TEAMS

N_TRAIN_PEOPLE = 30
N_HELD_PEOPLE = 20
MANAGER_SHARE = 3
"""One person in this many (of a split) manages others."""
FIELDS = ("extension", "office", "team", "manager")


@functools.cache
def org() -> dict[str, dict[str, str]]:
    """Every person's facts, keyed by lower-case name: {"name", "split", "extension",
    "office", "team", "manager"}. The same in every process (a fixed seed). Within a split,
    a third of the people are managers; everyone's manager is one of them (a manager's is
    another manager), so chains never leave the split."""
    rng = random.Random(20261129)
    out: dict[str, dict[str, str]] = {}
    for split, first, last, n in (
        ("train", FIRST_TRAIN, LAST_TRAIN, N_TRAIN_PEOPLE),
        ("val", FIRST_HELD, LAST_HELD, N_HELD_PEOPLE),
    ):
        names = rng.sample(sorted(f"{f} {g}" for f in first for g in last), n)
        managers = names[: n // MANAGER_SHARE]
        for name in names:
            out[name.lower()] = {
                "name": name,
                "split": split,
                "extension": str(rng.randint(2000, 9899)),
                "office": f"{rng.choice('ABCDEF')}{rng.randint(1, 5)}{rng.randint(10, 39)}",
                "team": rng.choice(TEAMS),
                "manager": rng.choice([m for m in managers if m != name]),
            }
    return out


server = MCPServer("org-chart", instructions="Look up people of the company.", log_level="WARNING")
# Every person and field as an `enum`: a client decoding under the schema (forced tool
# calls) picks one of them, as in the staff directory.
Person = Annotated[
    str, Field(max_length=40, json_schema_extra={"enum": sorted(p["name"] for p in org().values())})
]
FieldName = Annotated[str, Field(max_length=20, json_schema_extra={"enum": list(FIELDS)})]


@server.tool()
def lookup(person: Person, field: FieldName) -> str:
    """Look up one fact about a person of the company: their phone extension, office room,
    team, or manager (another person, whom you can look up in turn)."""
    found = org().get(" ".join(person.split()).lower())
    if found is None:
        raise ToolError(f"no one named {person!r} in the company")
    if field not in FIELDS:
        raise ToolError(f"unknown field {field!r}: one of {', '.join(FIELDS)}")
    return f"{found['name']}'s {field}: {found[field]}."


if __name__ == "__main__":
    server.run()
