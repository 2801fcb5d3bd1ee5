"""Scenario generation and the RULER judge on the real preset (SmolLM2-135M-Instruct).

On the tiny preset both produce noise (tasks like `"}}136136..."`, a random rollout
scored 1.0). Here the model can read: the generated tasks must be readable sentences
that fit the bundled MCP server's tools, and the judge must return one valid score per
trajectory with an explanation in words. Whether a 135M judge ranks well is not asserted:
it is a weak judge, and its explanations often restate the answer. A real server on a free loopback port, the real
bundled MCP server over stdio, litellm as a user would call it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import art_langgraph as art
from art_langgraph.engine import TorchEngine
from art_langgraph.rewards import ruler_score_group
from art_langgraph.serving import ServerHandle
from art_mcp import MCPToolset
from art_mcp.scenarios import generate_scenarios
from examples.mcp_books.server import BOOKS

pytestmark = pytest.mark.slow
SERVERS = {
    # The bundled server's tools (add, multiply, capital, currency), as a task would name them
    "examples.mcp_server.server": re.compile(r"\badd|multipl|capital|currenc", re.IGNORECASE),
    # A server no other generation test uses: book facts (author, year, and its titles)
    "examples.mcp_books.server": re.compile(
        r"author|wr[io]te|year|publish|book|novel|" + "|".join(BOOKS), re.IGNORECASE
    ),
}


def _readable(text: str) -> bool:
    words = text.split()
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return len(words) >= 3 and letters >= 0.7 * len(text)


@pytest.mark.parametrize(
    "module",
    [
        # the books server is the one the tests never saw before; the bundled one repeats it
        pytest.param(m, marks=[pytest.mark.slow_job] if m == "examples.mcp_server.server" else [])
        for m in sorted(SERVERS)
    ],
)
async def test_generated_scenarios_are_readable_tasks_for_the_tools(
    smol_server: tuple[TorchEngine, ServerHandle], module: str
) -> None:
    smol = smol_server[1]
    async with MCPToolset(f"{sys.executable} -m {module}") as toolset:
        scenarios = await generate_scenarios(
            toolset,
            4,
            generator="openai/smol",
            base_url=smol.base_url,
            api_key="unused",
            max_tokens=700,
            temperature=0.0,  # greedy: sampled, a 135M generator sometimes names no tool
        )
    assert scenarios
    tasks = [s.task for s in scenarios]
    assert all(_readable(t) for t in tasks), tasks
    fitting = [t for t in tasks if SERVERS[module].search(t)]
    assert len(fitting) >= len(tasks) / 2, tasks


async def test_ruler_on_the_real_model_scores_each_trajectory(
    smol_server: tuple[TorchEngine, ServerHandle],
) -> None:
    smol = smol_server[1]
    task = [{"role": "user", "content": "What is the capital of France?"}]
    answers = ["The capital of France is Paris.", "I like turtles.", "Berlin."]
    group = art.TrajectoryGroup(
        [
            art.Trajectory(messages=[*task, {"role": "assistant", "content": a}], reward=0.0)
            for a in answers
        ]
    )
    scored = await ruler_score_group(
        group, judge="openai/smol", base_url=smol.base_url, api_key="unused"
    )
    assert scored is not None
    scores = [t.metrics["ruler_score"] for t in scored.trajectories]
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)
    explanations = [line for t in scored.trajectories for line in t.logs if "RULER" in line]
    assert len(explanations) == 3
    # A 135M judge's explanations are short (it often restates the answer), but they are words
    assert all(any(c.isalpha() for c in e.removeprefix("RULER: ")) for e in explanations)


@pytest.mark.slow_job  # the default path of a user who brings only a server
def test_the_default_generation_ends_in_valid_items_on_an_unseen_server(tmp_path: Path) -> None:
    """`art-mcp scenarios --server X` with every default: the model being trained (the real
    preset) writes 24 tasks sampled at temperature 1, the tool-word filter on. A 135M model
    writes weak tasks (on the books server 2 of 24 survived the filter, seed 0), but what it
    writes is complete, valid items within its token budget, never a parse error."""
    out_file = tmp_path / "scenarios.jsonl"
    out = subprocess.run(
        [
            sys.executable, "-m", "art_mcp.cli", "scenarios",
            "--server", f"{sys.executable} -m examples.mcp_books.server",
            "--out", str(out_file), "--path", str(tmp_path / "runs"),
        ],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    items = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert items and all(_readable(i["task"]) for i in items), items
    assert f"{len(items)} scenarios for 2 tools" in out.stdout + out.stderr
