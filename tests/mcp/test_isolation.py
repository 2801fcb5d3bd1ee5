"""Rollouts against a server with write tools leave the user's world as it was.

The server is `@modelcontextprotocol/server-filesystem` from npm (14 tools, several of
which write), installed by the set-up command into `.mcp-servers-npm`. With `workdir`,
every server the harness starts works on a fresh copy of the folder; with
`server_per="rollout"` each rollout gets a server (and a copy) of its own.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from art_mcp import MCPToolset
from art_mcp.servers import WorkdirCopies

ROOT = Path(__file__).resolve().parents[2]
FS_SERVER = (
    ROOT / ".mcp-servers-npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)
COMMAND = f"node {FS_SERVER} {{workdir}}"

pytestmark = pytest.mark.skipif(
    not FS_SERVER.exists(), reason="the npm filesystem server is not installed (scripts/setup.sh)"
)


def _world(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "todo.txt").write_text("buy milk\n")
    (folder / "sub" / "plan.md").write_text("# plan\n")
    return folder


def _fingerprint(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else "dir"
        for p in sorted(folder.rglob("*"))
    }


async def test_a_rollout_s_writes_land_in_its_own_copy(tmp_path: Path) -> None:
    folder = _world(tmp_path)
    before = _fingerprint(folder)
    copies = WorkdirCopies(str(folder))
    main = MCPToolset(copies.command(COMMAND))
    await main.start()
    try:
        assert {"write_file", "move_file", "create_directory"} <= {t.name for t in main.tools}
        tools = {t.name: t for t in main.langchain_tools()}
        own = MCPToolset(copies.command(COMMAND))
        await own.start()
        try:
            with main.routed_to(own):  # as the harness does around one rollout
                listed = await tools["list_allowed_directories"].ainvoke({})
                root = listed.splitlines()[-1].strip()
                await tools["write_file"].ainvoke({"path": f"{root}/new.txt", "content": "x"})
                await tools["move_file"].ainvoke(
                    {"source": f"{root}/todo.txt", "destination": f"{root}/done.txt"}
                )
            assert (Path(root) / "new.txt").read_text() == "x"
            mine = (await main.call("list_directory", {"path": root})).text
            assert "permission" in mine.lower() or "denied" in mine.lower()  # not main's folder
            main_root = (await main.call("list_allowed_directories")).text.splitlines()[-1]
            listing = (await main.call("list_directory", {"path": main_root.strip()})).text
            assert "todo.txt" in listing and "new.txt" not in listing  # main's copy untouched
        finally:
            await own.close()
            copies.release(own.server)
        assert not Path(root).exists()  # the rollout's copy is gone with its server
    finally:
        await main.close()
        copies.release_all()
    assert _fingerprint(folder) == before


@pytest.mark.slow
def test_art_mcp_train_with_a_server_per_rollout_leaves_the_folder_unchanged(
    tmp_path: Path,
) -> None:
    folder = _world(tmp_path)
    before = _fingerprint(folder)
    scen = tmp_path / "scenarios.jsonl"
    rows = [
        {"id": f"s{i}", "task": f"Which file in the notes folder mentions {what}?", "answer": name}
        for i, (what, name) in enumerate([("milk", "todo.txt"), ("a plan", "plan.md")] * 3)
    ]
    scen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run(
        [
            sys.executable, "-m", "art_mcp.cli", "train", "--server", COMMAND,
            "--workdir", str(folder), "--server-per", "rollout",
            "--scenarios", str(scen), "--reward", "tests.mcp.fs_task:score",
            "--path", str(tmp_path / "runs"), "--steps", "1", "--group-size", "2",
            "--groups-per-step", "2", "--max-tokens", "32", "--max-turns", "2",
            "--tool-choice", "required", "--eval-samples", "1", "--val-fraction", "0.34",
            "--deny-tools", "directory_tree", "--max-servers", "3", "--base-model", "tiny",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "13 tools from" in out.stdout  # 14, less the denied one
    (model,) = (tmp_path / "runs" / "mcp" / "models").iterdir()
    files = sorted((model / "trajectories" / "train").iterdir())
    events = [
        e
        for f in files
        for line in f.read_text().splitlines()
        for t in json.loads(line)["trajectories"]
        for e in t["tool_events"]
    ]
    assert events and all(e["name"] != "directory_tree" for e in events)
    # the server answered about its copy of the folder, never about the folder itself
    said = json.dumps(events)
    assert str(folder) not in said and ("art-mcp-workdir-" in said or "notes" in said)
    assert _fingerprint(folder) == before
