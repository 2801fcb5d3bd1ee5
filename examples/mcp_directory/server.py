"""A staff-directory MCP server over stdio: the main job's task for a real small model.

    python -m examples.mcp_directory.server

One tool, `lookup(person, field)`: one fact (extension, office or team) about one person
of a fictional company. The people and their facts are generated from a fixed seed
(`directory()`), so no model knows them: an agent must look the fact up, then give it.
An unknown person or field is a tool error that says so.
The scenarios and reward live in `examples.mcp_directory.tasks`.
"""

from __future__ import annotations

import functools
import random
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

# First and last names, each list split in two: people in the held-out scenarios take
# both names from the second halves, so no held-out person shares a name with a trained one.
FIRST_TRAIN = (
    "Alice Bruno Carla Dmitri Elena Farid Greta Hugo Irene Jonas Keiko Lars Maya Nadia Omar "
    "Pablo Rosa Sven Tara Viktor"
).split()
FIRST_HELD = "Anika Boris Chloe Diego Esther Felix Hana Ivan Julia Kofi".split()
LAST_TRAIN = (
    "Abbot Brandt Castell Dorsey Eklund Fenwick Galloway Holm Ibarra Jessup Kovac Lindqvist "
    "Marlow Norberg Okafor Pruett Quimby Rourke Sandoval Thorne"
).split()
LAST_HELD = (
    "Ashdown Bellamy Crane Delacroix Everly Fairbanks Gilroy Hartwell Iverson Jarvis".split()
)
TEAMS = (
    "Finance Legal Marketing Research Sales Support Security Design Logistics Payroll "
    "Facilities Training"
).split()
N_TRAIN_PEOPLE = 24
N_HELD_PEOPLE = 16


@functools.cache
def directory() -> dict[str, dict[str, str]]:
    """Every person's facts, keyed by lower-case name: {"extension", "office", "team",
    "name", "split"}. The same in every process (a fixed seed)."""
    rng = random.Random(20261125)
    out: dict[str, dict[str, str]] = {}
    for split, first, last, n in (
        ("train", FIRST_TRAIN, LAST_TRAIN, N_TRAIN_PEOPLE),
        ("val", FIRST_HELD, LAST_HELD, N_HELD_PEOPLE),
    ):
        names = sorted(f"{f} {g}" for f in first for g in last)
        for name in rng.sample(names, n):
            out[name.lower()] = {
                "name": name,
                "split": split,
                "extension": str(rng.randint(2000, 9899)),
                "office": f"{rng.choice('ABCDEF')}{rng.randint(1, 5)}{rng.randint(10, 39)}",
                "team": rng.choice(TEAMS),
            }
    return out


FIELDS = ("extension", "office", "team")

server = MCPServer(
    "staff-directory", instructions="Look up people of the company.", log_level="WARNING"
)
# The schema lists every person and field as an `enum`: a client that decodes under it
# (forced tool calls) picks one of them, as a small model should, instead of spelling a
# name letter by letter. Held-out people are listed too (the directory is the server's,
# not the training set's); a scenario that names them is never trained on.
Person = Annotated[
    str,
    Field(
        max_length=40, json_schema_extra={"enum": sorted(p["name"] for p in directory().values())}
    ),
]
FieldName = Annotated[str, Field(max_length=20, json_schema_extra={"enum": list(FIELDS)})]


@server.tool()
def lookup(person: Person, field: FieldName) -> str:
    """Step 1 of every task: look up one fact about a person (their phone extension, office
    room or team). Step 2: call complete_task with the fact it returns."""
    found = directory().get(" ".join(person.split()).lower())
    if found is None:
        raise ToolError(f"no one named {person!r} in the directory")
    if field not in FIELDS:
        raise ToolError(f"unknown field {field!r}: one of {', '.join(FIELDS)}")
    # A labelled fact, not a bare value: a small model copies "Ann Bell's office: C135"
    # into its answer far more often than "C135" (SmolLM2-135M at temperature 1, the
    # turn after the lookup: 19 of 64 answers right against 0 of 64). The hint after it
    # stops the untrained model from repeating the lookup until its turns run out (24
    # held-out scenarios: greedy success 0.04 -> 0.21, sampled 0.00 -> 0.06;
    # bench/results/misc/directory_probe.json).
    return f"{found['name']}'s {field}: {found[field]}. Now call complete_task with it."


if __name__ == "__main__":
    server.run()
