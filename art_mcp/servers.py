"""Where a run's tool calls go: the run's MCP server, or a fresh one per rollout.

`Servers` starts the server processes of a run: one for the whole run
(`server_per="run"`), or with `server_per="rollout"` one more for every rollout and
held-out episode (`world()`), at most `max_servers` alive at once. With a `workdir`,
`WorkdirCopies` gives every server started a fresh copy of that folder ('{workdir}' in
the command), removed when the server ends, so the folder itself is never changed.
`check_server` refuses, before anything starts, settings that need a server command.

Left out: the MCP session and its tools (toolset.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from art_langgraph.errors import UsageError
from art_mcp.config import HarnessConfig
from art_mcp.toolset import MCPToolset


def check_server(server: Any, cfg: HarnessConfig) -> None:
    """Refuse `server_per="rollout"` or a workdir without a server command, and a workdir
    that is not a folder or that the command does not name."""
    is_command = isinstance(server, list | tuple) or (
        isinstance(server, str) and not server.startswith(("http://", "https://"))
    )
    if (cfg.server_per == "rollout" or cfg.workdir is not None) and not is_command:
        raise UsageError(
            "server_per='rollout' and workdir start server processes: give the server as a "
            "command, not a URL or an object"
        )
    if cfg.workdir is not None:
        if not Path(cfg.workdir).is_dir():
            raise UsageError(f"workdir {cfg.workdir!r} is not a folder")
        if "{workdir}" not in (server if isinstance(server, str) else " ".join(server)):
            raise UsageError("workdir is given but the server command has no '{workdir}' in it")


class Servers:
    """The run's server (`toolset`, not started yet) and, per rollout, servers of its own."""

    def __init__(
        self,
        server: Any,
        cfg: HarnessConfig,
        *,
        env: dict[str, str] | None,
        stderr_log: Path,
    ) -> None:
        self.server = server
        self.cfg = cfg
        self.env = env
        self.stderr_log = stderr_log
        self.copies = WorkdirCopies(cfg.workdir)
        self._slots = asyncio.Semaphore(cfg.max_servers)
        self.toolset = self.new_toolset()

    def new_toolset(self) -> MCPToolset:
        """A toolset over a new server process (over a new workdir copy, with a workdir)."""
        return MCPToolset(
            self.copies.command(self.server),
            env=self.env,
            stderr_log=self.stderr_log,
            allow_tools=self.cfg.allow_tools,
            deny_tools=self.cfg.deny_tools,
        )

    @contextlib.asynccontextmanager
    async def world(self) -> AsyncIterator[None]:
        """Where one rollout's tool calls go: the run's server, or one of its own."""
        if self.cfg.server_per == "run":
            yield
            return
        async with self._slots:
            own = self.new_toolset()
            try:
                await own.start()
                with self.toolset.routed_to(own):
                    yield
            finally:
                await own.close()
                self.copies.release(own.server)

    async def close(self) -> None:
        """Stop the run's server and remove every workdir copy left."""
        try:
            await self.toolset.close()
        finally:
            self.copies.release_all()


class WorkdirCopies:
    """Fresh copies of the run's workdir, one per server started, removed when it ends."""

    def __init__(self, workdir: str | None) -> None:
        self.workdir = workdir
        self.made: dict[str, str] = {}  # the command -> its copy

    def command(self, server: Any) -> Any:
        """`server` with '{workdir}' replaced by a new copy (unchanged without a workdir)."""
        if self.workdir is None:
            return server
        root = tempfile.mkdtemp(prefix="art-mcp-workdir-")
        copy = os.path.join(root, Path(self.workdir).name or "workdir")
        shutil.copytree(self.workdir, copy, symlinks=True)
        if isinstance(server, str):
            cmd: Any = server.replace("{workdir}", shlex.quote(copy))
            self.made[cmd] = root
        else:
            cmd = [a.replace("{workdir}", copy) for a in server]
            self.made[shlex.join(cmd)] = root
        return cmd

    def release(self, command: Any) -> None:
        key = command if isinstance(command, str) else shlex.join(command)
        if (root := self.made.pop(key, None)) is not None:
            shutil.rmtree(root, ignore_errors=True)

    def release_all(self) -> None:
        for root in self.made.values():
            shutil.rmtree(root, ignore_errors=True)
        self.made.clear()
