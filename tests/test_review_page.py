"""The HTML review page of a real model folder, checked as text and in headless Chromium.

The folder comes from a real run: a LangGraph graph with forced tool calls (one tool
raises) on the warm-started tiny model, logged to a model that then trains a step.
Chromium is Debian's (`scripts/test.sh` installs it); without it the browser test skips,
unless ART_REQUIRE_CHROMIUM=1.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import art_langgraph as art
from art_langgraph.review_page import write_review_page
from tests.backend.rollouts import rollout
from tests.langgraph.tools import TOOLS, explode, one_tool_call_graph

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
async def folder(tool_model: art.TrainableModel, lg_backend: art.LocalBackend) -> Path:
    model = art.TrainableModel(name="review", project="lg", base_model="tiny")
    await model.register(lg_backend)
    llm = tool_model.chat_model(max_tokens=40, temperature=0.7)

    async def run(i: int) -> art.Trajectory:
        choice = "explode" if i == 1 else "required"
        graph = one_tool_call_graph(llm.bind_tools([*TOOLS, explode], tool_choice=choice))
        with art.capture(metadata={"scenario": f"q{i} <script>alert(1)</script>"}) as traj:
            await graph.ainvoke({"messages": [("user", f"What is {i} plus 2? <b>bold</b>")]})
        traj.reward = 0.25 * i
        return traj

    trajs = list(await asyncio.gather(*(run(i) for i in range(4))))
    trajs[3].metrics["ruler_score"] = 0.75
    trajs[3].log("RULER: it called the right tool")
    await model.log([art.TrajectoryGroup(trajs[:2]), art.TrajectoryGroup(trajs[2:])], split="val")
    plain = list(await asyncio.gather(*(rollout(model, f"Say {i}") for i in range(4))))
    for i, t in enumerate(plain):
        t.reward = float(i % 2)
    await model.train([art.TrajectoryGroup(plain)], art.TrainConfig())
    await model.log([art.TrajectoryGroup(trajs)], split="val")
    return lg_backend.path / "lg" / "models" / "review"


def test_the_page_holds_curves_steps_trajectories_and_shaded_tokens(folder: Path) -> None:
    page = write_review_page(folder).read_text()
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<link" not in page and " src=" not in page
    assert page.count('<path class="curve"') == 2  # train and val
    assert 'data-split="val" data-step="0"' in page and 'data-split="train" data-step="1"' in page
    assert page.count('<article class="trajectory"') == 4 + 4 + 4
    assert 'class="tool-error"' in page and "boom" in page
    assert "RULER: it called the right tool" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert page.count('class="tok" data-lp=') > 50  # tokens shaded by logprob, decoded
    assert "#" not in page.split('class="tok" data-lp=')[1].split(">")[1][:2]  # text, not ids


def test_the_command_line_writes_it_and_refuses_a_wrong_folder(
    folder: Path, tmp_path: Path
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "art_langgraph.cli",
            "report",
            str(folder),
            "--out",
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.html").stat().st_size > 10_000
    bad = subprocess.run(
        [sys.executable, "-m", "art_langgraph.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "is it a model's folder" in bad.stderr


def test_in_headless_chromium(folder: Path, tmp_path: Path) -> None:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("ART_REQUIRE_CHROMIUM") == "1":
            pytest.fail("ART_REQUIRE_CHROMIUM=1 but Debian's chromium is not installed")
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")
    page = write_review_page(folder, tmp_path / "review.html")
    flags = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [*flags, "--virtual-time-budget=3000", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert 'data-ready="1"' in dom  # the page's script ran
    assert dom.count('<path class="curve"') == 2
    assert dom.count('<article class="trajectory"') == 12
    assert '<span id="shown">' in dom and '<span id="shown">0</span>' not in dom
    shot = tmp_path / "review.png"
    tool_error = dom.split('<article class="trajectory" id="')[2].split('"')[0]  # val 0, q1
    subprocess.run(
        [
            *flags,
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            f"{page.as_uri()}#{tool_error}",
        ],
        capture_output=True,
        timeout=120,
    )
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    if os.environ.get("ART_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["ART_KEEP_SCREENSHOT"])
