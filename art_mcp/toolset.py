"""`MCPToolset`: an MCP server's tools as LangChain tools, over one reused session.

    async with MCPToolset("python my_server.py") as toolset:      # stdio: a command
        tools = toolset.langchain_tools()                           # for any LangGraph graph
    MCPToolset("http://127.0.0.1:8000/mcp")                         # streamable HTTP: a URL
    MCPToolset(server_object)                                       # in-process (tests)

One session is opened by `start()` and reused by every call (never a process per call).
It lives in a background task of its own, so it can be used, closed and restarted from
any task. A tool result becomes the tool's text output; `is_error`, a timeout and a
crashed server become a `ToolException`, which LangGraph's ToolNode turns into an error
ToolMessage (and `art.capture()` into a ToolEvent with `error`), so the rollout goes on.
After a crash the next call restarts the server.

Written on the `mcp` client directly (a thin conversion): `langchain-mcp-adapters` does
not import with mcp 2.x. Left out: prompts, sampling callbacks and OAuth.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any

from art_langgraph.errors import InfrastructureError, UsageError

__all__ = ["MCPToolset", "ToolOutcome"]

log = logging.getLogger(__name__)


@dataclass
class ToolOutcome:
    """What one tool call returned."""

    text: str
    is_error: bool
    structured: Any = None
    latency_s: float = 0.0


def _target(server: Any, env: dict[str, str] | None) -> Any:
    from mcp import StdioServerParameters

    if isinstance(server, str) and server.startswith(("http://", "https://")):
        return server
    if isinstance(server, str | list | tuple):
        argv = shlex.split(server) if isinstance(server, str) else list(server)
        if not argv:
            raise UsageError("the MCP server command is empty")
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the same interpreter (and environment) as ours
        return StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    return server  # an MCPServer / Server object, or a Transport


class MCPToolset:
    """Tools of one MCP server (see the module doc)."""

    def __init__(
        self,
        server: Any,
        *,
        env: dict[str, str] | None = None,
        timeout_s: float = 30.0,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.server = server
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._target = _target(server, env)
        self._client: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self.tools: list[Any] = []
        """The server's tools (mcp `Tool` records), listed at start."""
        self.resources: list[Any] = []
        self.restarts = 0
        """How many times a crashed server was restarted."""

    @property
    def label(self) -> str:
        if isinstance(self.server, str):
            return self.server
        if isinstance(self.server, list | tuple):
            return shlex.join(self.server)
        return type(self.server).__name__

    async def __aenter__(self) -> MCPToolset:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -------------------------------------------------------------- session
    async def start(self) -> None:
        """Open the session (start the server process for stdio) and list tools and resources."""
        async with self._lock:
            if self._client is None:
                await self._open()

    async def _open(self) -> None:
        from mcp import Client

        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        stop = self._stop

        async def own() -> None:
            try:
                async with Client(self._target) as client:
                    ready.set_result(client)
                    await stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                else:
                    log.warning("MCP session for %s ended: %r", self.label, exc)
            finally:
                self._client = None

        self._owner = asyncio.create_task(own(), name=f"mcp-session:{self.label}")
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.startup_timeout_s)
        except Exception as exc:
            await self._close_owner()
            raise InfrastructureError(f"cannot start MCP server {self.label}: {exc!r}") from exc
        self._client = client
        self.tools = list((await client.list_tools()).tools)
        try:
            self.resources = list((await client.list_resources()).resources)
        except Exception:  # a server without resources
            self.resources = []

    async def _close_owner(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._owner is not None:
            try:
                await asyncio.wait_for(self._owner, 10)
            except (TimeoutError, asyncio.CancelledError, Exception):
                self._owner.cancel()
        self._owner, self._client = None, None

    async def close(self) -> None:
        """End the session (and the server process)."""
        async with self._lock:
            await self._close_owner()

    async def restart(self) -> None:
        async with self._lock:
            await self._close_owner()
            await self._open()
            self.restarts += 1

    # ---------------------------------------------------------------- tools
    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI function specs."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or t.title or t.name,
                    "parameters": t.input_schema or {"type": "object", "properties": {}},
                },
            }
            for t in self.tools
        ]

    async def call(self, name: str, arguments: dict[str, Any] | None = None) -> ToolOutcome:
        """Call a tool. Errors of every kind come back as `ToolOutcome(is_error=True)`."""
        t0 = time.perf_counter()
        if self._client is None:
            try:
                await (self.restart() if self._owner is not None or self.tools else self.start())
            except InfrastructureError as exc:
                return ToolOutcome(
                    f"error: the MCP server is down: {exc}",
                    True,
                    latency_s=time.perf_counter() - t0,
                )
        client = self._client
        try:
            result = await asyncio.wait_for(client.call_tool(name, arguments or {}), self.timeout_s)
        except TimeoutError:
            return ToolOutcome(
                f"error: tool {name!r} timed out after {self.timeout_s} s",
                True,
                latency_s=self.timeout_s,
            )
        except Exception as exc:  # the transport broke: the server crashed or hung up
            log.warning("MCP call %s failed (%r); the server will be restarted", name, exc)
            await self._close_owner()
            return ToolOutcome(
                f"error: the MCP server failed during {name!r}: {exc!r}",
                True,
                latency_s=time.perf_counter() - t0,
            )
        text = "\n".join(_block_text(b) for b in result.content) or (
            json.dumps(result.structured_content) if result.structured_content is not None else ""
        )
        return ToolOutcome(
            text, bool(result.is_error), result.structured_content, time.perf_counter() - t0
        )

    def langchain_tools(self) -> list[Any]:
        """The tools as LangChain `StructuredTool`s (async), for any graph."""
        from langchain_core.tools import StructuredTool, ToolException

        if not self.tools and self._client is None:
            raise UsageError("start the toolset first: `await toolset.start()` (or `async with`)")

        def make(tool: Any) -> Any:
            async def run(**kwargs: Any) -> str:
                outcome = await self.call(tool.name, kwargs)
                if outcome.is_error:
                    raise ToolException(outcome.text)
                return outcome.text

            return StructuredTool(
                name=tool.name,
                description=tool.description or tool.name,
                args_schema=tool.input_schema or {"type": "object", "properties": {}},
                coroutine=run,
                handle_tool_error=True,
                handle_validation_error=True,
            )

        return [make(t) for t in self.tools]


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind == "resource":
        res = block.resource
        return str(getattr(res, "text", "") or getattr(res, "uri", ""))
    return f"[{kind} content]"
