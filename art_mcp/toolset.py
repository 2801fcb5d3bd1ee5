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
import contextlib
import contextvars
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_langgraph.errors import InfrastructureError, UsageError
from art_langgraph.runtime.watchdog import log_tail

log = logging.getLogger(__name__)

_ROUTES: contextvars.ContextVar[dict[int, MCPToolset] | None] = contextvars.ContextVar(
    "art_mcp_routes", default=None
)
"""id(toolset) -> the toolset its tools' calls go to in this context (`routed_to`)."""


@dataclass
class ToolOutcome:
    """What one tool call returned."""

    text: str
    is_error: bool
    structured: Any = None
    latency_s: float = 0.0


_EXIT_MARK = "art-mcp: the server exited with code "

# POSIX: run the command under sh, which reports its exit code on stderr; the mcp client
# does not expose the process, and "Connection closed" alone does not say why.
_REPORT_EXIT = '"$@"; code=$?; echo "' + _EXIT_MARK + '$code" >&2; exit $code'


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
        if env is not None and not all(
            isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items()
        ):
            raise UsageError("env must map variable names (no '=') to string values")
        sh = shutil.which("sh") if os.name == "posix" else None
        if sh is not None:
            argv = [sh, "-c", _REPORT_EXIT, "sh", *argv]
        return StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    return server  # an MCPServer / Server object, or a Transport


def _leaves(exc: BaseException) -> list[BaseException]:
    """The real errors inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


class MCPToolset:
    """Tools of one MCP server (see the module doc)."""

    def __init__(
        self,
        server: Any,
        *,
        env: dict[str, str] | None = None,
        timeout_s: float = 30.0,
        startup_timeout_s: float = 30.0,
        stderr_log: str | Path | None = None,
        allow_tools: list[str] | None = None,
        deny_tools: list[str] | None = None,
    ) -> None:
        """`env`: variables added to a stdio server's environment. `stderr_log`: the file
        a stdio server's stderr goes to (None: a temporary file), so its tracebacks never
        flood the console; appended to, and a failed start quotes the last lines this
        toolset's server wrote there; a temporary file is deleted when the session ends
        unless an error or warning named it (a failed start that wrote to stderr, a crash),
        so the path it named still holds the traceback. `allow_tools` / `deny_tools`: the only tools offered, or
        tools never offered (names the server does not list are an error at start)."""
        self.server = server
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._target = _target(server, env)
        self.allow_tools = list(allow_tools) if allow_tools is not None else None
        self.deny_tools = list(deny_tools or [])
        self.stderr_log: Path | None = None
        """Where a stdio server's stderr goes."""
        self._temp_log = False
        """Whether `stderr_log` is a temporary file of this toolset's own (see `close`)."""
        self._keep_log = False
        """Whether an error or warning named `stderr_log` for its traceback: a temporary one
        is then kept."""
        if (
            not isinstance(self._target, str)
            and type(self._target).__name__ == "StdioServerParameters"
        ):
            if stderr_log is None:
                fd, name = tempfile.mkstemp(prefix="art-mcp-server-", suffix=".log")
                os.close(fd)
                stderr_log = name
                self._temp_log = True
            self.stderr_log = Path(stderr_log)
            self.stderr_log.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = 0
        """Where this toolset's part of `stderr_log` begins: a failed start quotes only it."""
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

        if self.stderr_log is not None and self.stderr_log.exists():
            self._log_start = self.stderr_log.stat().st_size

        async def own() -> None:
            errlog = open(self.stderr_log, "a") if self.stderr_log is not None else None  # noqa: SIM115
            try:
                target = self._target
                if errlog is not None:
                    from mcp.client.stdio import stdio_client

                    target = stdio_client(self._target, errlog=errlog)
                async with Client(target) as client:
                    ready.set_result(client)
                    await stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                    ready.exception()  # retrieved here: a late failure must not log as unread
                else:
                    log.warning("MCP session for %s ended: %r", self.label, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finally:
                self._client = None
                if errlog is not None:
                    errlog.close()

        self._owner = asyncio.create_task(own(), name=f"mcp-session:{self.label}")
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.startup_timeout_s)
        except Exception as exc:
            await self._close_owner(graceful=False)
            msg = self._start_failure(exc)
            self._drop_temp_log()
            raise InfrastructureError(msg) from None
        self._client = client
        try:
            self.tools = self._select(list((await client.list_tools()).tools))
        except UsageError:
            await self._close_owner()
            self._drop_temp_log()
            raise
        try:
            self.resources = list((await client.list_resources()).resources)
        except Exception:  # a server without resources
            self.resources = []

    def _select(self, tools: list[Any]) -> list[Any]:
        """The listed tools, less those `allow_tools`/`deny_tools` leave out."""
        names = [t.name for t in tools]
        asked = [*(self.allow_tools or []), *self.deny_tools]
        if unknown := [n for n in asked if n not in names]:
            raise UsageError(
                f"{self.label} has no tool named {', '.join(map(repr, unknown))}; its tools: "
                f"{', '.join(names)}"
            )
        return [
            t
            for t in tools
            if (self.allow_tools is None or t.name in self.allow_tools)
            and t.name not in self.deny_tools
        ]

    def _start_failure(self, exc: BaseException) -> str:
        """Why the server did not start: its error, its exit code and its last stderr lines."""
        if isinstance(exc, TimeoutError):
            why = f"it did not answer MCP's initialize within {self.startup_timeout_s:g} s"
        else:
            why = "; ".join(dict.fromkeys(f"{type(e).__name__}: {e}" for e in _leaves(exc)))
        lines = log_tail(self.stderr_log, self._log_start, lines=15)
        codes = [x.removeprefix(_EXIT_MARK) for x in lines if x.startswith(_EXIT_MARK)]
        lines = [x for x in lines if not x.startswith(_EXIT_MARK)]
        msg = f"cannot start MCP server {self.label}: {why}"
        if codes:
            msg += f"; it exited with code {codes[-1]}"
        if lines:
            msg += f"\nits stderr ({self.stderr_log}) ends with:\n  " + "\n  ".join(lines)
            self._keep_log = True
        return msg

    async def _close_owner(self, *, graceful: bool = True) -> None:
        """End the session task: let it close the session (graceful), or cancel it at once
        (a session that never opened has nothing to close)."""
        if self._stop is not None:
            self._stop.set()
        owner = self._owner
        if owner is not None:
            if not graceful:
                owner.cancel()
            try:
                await asyncio.wait_for(owner, 10)
            except (TimeoutError, asyncio.CancelledError, Exception):
                owner.cancel()
        self._owner, self._client = None, None

    def _drop_temp_log(self) -> None:
        """Delete a temporary stderr log that no error or warning named."""
        if self._temp_log and not self._keep_log and self.stderr_log is not None:
            self.stderr_log.unlink(missing_ok=True)

    async def close(self) -> None:
        """End the session (and the server process); delete a temporary stderr log that no
        error or warning named."""
        async with self._lock:
            await self._close_owner()
            self._drop_temp_log()

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
        if name in self.deny_tools or (
            self.allow_tools is not None and name not in self.allow_tools
        ):
            return ToolOutcome(f"error: tool {name!r} is not offered here", True, latency_s=0.0)
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
            where = f"; its stderr: {self.stderr_log}" if self.stderr_log is not None else ""
            log.warning("MCP call %s failed (%r); the server will be restarted%s", name, exc, where)
            self._keep_log = self.stderr_log is not None
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

    @contextlib.contextmanager
    def routed_to(self, other: MCPToolset) -> Iterator[None]:
        """Within this block (this task and the tasks it starts), the calls of this toolset's
        `langchain_tools` go to `other`: another process of the same server, so a rollout
        can run in a world of its own while the agent keeps one set of tools."""
        token = _ROUTES.set({**(_ROUTES.get() or {}), id(self): other})
        try:
            yield
        finally:
            _ROUTES.reset(token)

    def langchain_tools(self) -> list[Any]:
        """The tools as LangChain `StructuredTool`s (async), for any graph."""
        from langchain_core.tools import StructuredTool, ToolException

        if not self.tools and self._client is None:
            raise UsageError("start the toolset first: `await toolset.start()` (or `async with`)")

        def make(tool: Any) -> Any:
            async def run(**kwargs: Any) -> str:
                outcome = await (_ROUTES.get() or {}).get(id(self), self).call(tool.name, kwargs)
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
