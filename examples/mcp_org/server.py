"""An org-chart MCP server over stdio: the two-hop task's server.

    python -m examples.mcp_org.server

Two tools over a fictional company:

- `project_lead(project)`: who leads a project (a person of the company);
- `lookup(person, field)`: one fact about a person, their extension, office or team.

A question about a project's lead (its extension, office or team) takes two dependent
lookups: `project_lead` first, then `lookup` of the person it returned, whose name comes
from the first result. The question names a project, which is no person: the only way in
is the first tool, so the order is the task's, not a guess. The people, projects and
facts are generated from a fixed seed (`org()`, `projects()`), so no model knows them. An
unknown person, project or field is a tool error that says so. Results are plain labelled
facts; a lead's result adds that `lookup` knows that person's extension, office and team,
as a server written for agents would. Untrained, on the validation slice's 144 two-hop
episodes (bench/results/turn_rules/org_probe_avx512bf16.json): without that sentence, 130
re-made `project_lead` as their second call and none went on to `lookup`; with it, 123
and 12. Which fact, and whether a question needs it, is the agent's to decide.

People and projects are split in two: held-out people take both names from name halves
training never uses (as in the staff directory, `examples/mcp_directory`), held-out
projects take codenames training never uses, and a held-out project's lead is a held-out
person, so a held-out question's every entity is new. The scenarios and reward live in
`examples.mcp_org.tasks`.
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
PROJECTS_TRAIN = (
    "Amber Basalt Cobalt Delta Ember Fjord Garnet Harbor Indigo Juniper Kestrel Lantern "
    "Marble Nimbus Onyx Pinnacle Quartz Raven Summit Tundra Umber Vortex Willow Zephyr"
).split()
PROJECTS_HELD = (
    "Aurora Beacon Cedar Dune Echo Flint Glacier Horizon Iris Jasper Krypton Lotus Meadow "
    "Nova Orchid Prism"
).split()
FIELDS = ("extension", "office", "team")


@functools.cache
def org() -> dict[str, dict[str, str]]:
    """Every person's facts, keyed by lower-case name: {"name", "split", "extension",
    "office", "team"}. The same in every process (a fixed seed)."""
    rng = random.Random(20261129)
    out: dict[str, dict[str, str]] = {}
    for split, first, last, n in (
        ("train", FIRST_TRAIN, LAST_TRAIN, N_TRAIN_PEOPLE),
        ("val", FIRST_HELD, LAST_HELD, N_HELD_PEOPLE),
    ):
        for name in rng.sample(sorted(f"{f} {g}" for f in first for g in last), n):
            out[name.lower()] = {
                "name": name,
                "split": split,
                "extension": str(rng.randint(2000, 9899)),
                "office": f"{rng.choice('ABCDEF')}{rng.randint(1, 5)}{rng.randint(10, 39)}",
                "team": rng.choice(TEAMS),
            }
    return out


@functools.cache
def projects() -> dict[str, dict[str, str]]:
    """Every project, keyed by lower-case codename: {"name", "split", "lead"}; a project's
    lead is a person of its split, each person leading at most one project."""
    rng = random.Random(20261130)
    out: dict[str, dict[str, str]] = {}
    for split, names in (("train", PROJECTS_TRAIN), ("val", PROJECTS_HELD)):
        people = sorted(p["name"] for p in org().values() if p["split"] == split)
        for name, lead in zip(names, rng.sample(people, len(names)), strict=True):
            out[name.lower()] = {"name": name, "split": split, "lead": lead}
    return out


server = MCPServer("org-chart", instructions="Look up people of the company.", log_level="WARNING")
# Every person, project and field as an `enum`: a client decoding under the schema (forced
# tool calls) picks one of them, as in the staff directory.
Person = Annotated[
    str, Field(max_length=40, json_schema_extra={"enum": sorted(p["name"] for p in org().values())})
]
Project = Annotated[
    str,
    Field(
        max_length=20, json_schema_extra={"enum": sorted(p["name"] for p in projects().values())}
    ),
]
FieldName = Annotated[str, Field(max_length=20, json_schema_extra={"enum": list(FIELDS)})]


@server.tool()
def project_lead(project: Project) -> str:
    """Who leads a project of the company (a person, whom `lookup` knows)."""
    found = projects().get(project.strip().lower())
    if found is None:
        raise ToolError(f"no project named {project!r}")
    return lead_result(found["name"], found["lead"])


@server.tool()
def lookup(person: Person, field: FieldName) -> str:
    """Look up one fact about a person of the company: their phone extension, office room
    or team."""
    found = org().get(" ".join(person.split()).lower())
    if found is None:
        raise ToolError(f"no one named {person!r} in the company")
    if field not in FIELDS:
        raise ToolError(f"unknown field {field!r}: one of {', '.join(FIELDS)}")
    return fact_result(found["name"], field, found[field])


def lead_result(project: str, lead: str) -> str:
    """What `project_lead` returns."""
    return (
        f"Project {project} is led by {lead}. For {lead}'s extension, office or team, call lookup."
    )


def fact_result(person: str, field: str, value: str) -> str:
    """What `lookup` returns."""
    return f"{person}'s {field}: {value}."


if __name__ == "__main__":
    server.run()
