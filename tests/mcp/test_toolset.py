"""MCPToolset against the bundled MCP server: a real subprocess over stdio, and in-process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import art_langgraph as art
from art_mcp import MCPToolset

SERVER = "python -m examples.mcp_server.server"


@pytest.fixture
async def stdio_toolset(tmp_path: Path) -> AsyncIterator[MCPToolset]:
    env = {**os.environ, "ART_MCP_TEST_TOOLS": "1"}
    log_file = tmp_path / "server.log"  # a crash keeps its log: not in the system's tmp
    async with MCPToolset(SERVER, env=env, timeout_s=2.0, stderr_log=log_file) as ts:
        yield ts


async def test_lists_tools_and_resources(stdio_toolset: MCPToolset) -> None:
    names = [t.name for t in stdio_toolset.tools]
    assert {"add", "multiply", "capital", "wait", "crash"} <= set(names)
    assert [str(r.uri) for r in stdio_toolset.resources] == ["facts://countries"]
    specs = {s["function"]["name"]: s["function"] for s in stdio_toolset.openai_tools()}
    assert specs["add"]["parameters"]["required"] == ["a", "b"]
    assert specs["capital"]["description"] == "The capital city of a country."


async def test_calls_reuse_one_session_and_errors_come_back_as_results(
    stdio_toolset: MCPToolset,
) -> None:
    owner = stdio_toolset._owner
    ok = await stdio_toolset.call("add", {"a": 2, "b": 40})
    assert (ok.text, ok.is_error, ok.structured) == ("42", False, {"result": 42})
    bad = await stdio_toolset.call("capital", {"country": "Atlantis"})
    assert bad.is_error and "unknown country" in bad.text
    invalid = await stdio_toolset.call("add", {"a": "x"})
    assert invalid.is_error
    slow = await stdio_toolset.call("wait", {"seconds": 5})
    assert slow.is_error and "timed out" in slow.text
    assert stdio_toolset._owner is owner  # still the same session (no process per call)


async def test_a_crashed_server_is_restarted_for_the_next_call(stdio_toolset: MCPToolset) -> None:
    crashed = await stdio_toolset.call("crash")
    assert crashed.is_error and "failed" in crashed.text
    after = await stdio_toolset.call("multiply", {"a": 6, "b": 7})
    assert after.text == "42" and stdio_toolset.restarts == 1


async def test_in_process_server() -> None:
    from examples.mcp_server.server import server

    async with MCPToolset(server) as ts:
        assert (await ts.call("capital", {"country": "Peru"})).text == "Lima"


async def test_langchain_tools_in_a_graph_record_tool_events(stdio_toolset: MCPToolset) -> None:
    from langchain_core.messages import AIMessage

    tools = stdio_toolset.langchain_tools()
    calls = [
        {"id": "c1", "name": "add", "args": {"a": 1, "b": 2}},
        {"id": "c2", "name": "capital", "args": {"country": "Mars"}},
    ]
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    app = graph.compile()
    with art.capture() as traj:
        out = await app.ainvoke({"messages": [AIMessage(content="", tool_calls=calls)]})
        crash = await app.ainvoke(
            {
                "messages": [
                    AIMessage(content="", tool_calls=[{"id": "c3", "name": "crash", "args": {}}])
                ]
            }
        )
    results = {m.tool_call_id: m for m in out["messages"][1:]}
    assert results["c1"].content == "3" and results["c1"].status == "success"
    assert results["c2"].status == "error" and "unknown country" in results["c2"].content
    assert (
        crash["messages"][-1].status == "error"
    )  # a crashed server: an error result, the rollout goes on
    events = {e.tool_call_id: e for e in traj.tool_events}
    assert events["c1"].result == "3" and events["c1"].error is None
    assert events["c2"].error is not None and events["c3"].error is not None
    assert (await stdio_toolset.call("add", {"a": 1, "b": 1})).text == "2"  # restarted


async def test_a_server_that_exits_on_start_reports_its_exit_code_and_stderr(
    tmp_path: Path,
) -> None:
    cmd = "python -c 'import sys; print(\"missing API key\", file=sys.stderr); sys.exit(3)'"
    log_file = tmp_path / "server.log"
    with pytest.raises(art.InfrastructureError) as info:
        await MCPToolset(cmd, startup_timeout_s=20, stderr_log=log_file).start()
    msg = str(info.value)
    assert "cannot start MCP server" in msg and "exited with code 3" in msg
    assert "missing API key" in msg and "ExceptionGroup" not in msg


async def test_a_failed_start_quotes_this_run_s_stderr_not_an_earlier_one(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    log_file.write_text("OLD RUN: something else went wrong\n")
    cmd = "python -c 'import sys; print(\"this run\", file=sys.stderr); sys.exit(3)'"
    with pytest.raises(art.InfrastructureError) as info:
        await MCPToolset(cmd, startup_timeout_s=20, stderr_log=log_file).start()
    assert "this run" in str(info.value) and "OLD RUN" not in str(info.value)


async def test_a_server_that_hangs_on_initialize_is_a_clear_error_without_noise(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    cmd = "python -c 'import time; time.sleep(600)'"
    with pytest.raises(art.InfrastructureError, match="did not answer MCP's initialize within 2 s"):
        await MCPToolset(cmd, startup_timeout_s=2).start()
    import gc

    gc.collect()  # an unread future's complaint is logged when it is collected
    await asyncio.sleep(0.1)
    out, err = capfd.readouterr()
    assert "never retrieved" not in out + err + caplog.text


async def test_server_stderr_goes_to_its_log_file_not_the_console(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log_file = tmp_path / "logs" / "server.log"
    env = {"ART_MCP_TEST_TOOLS": "1", "PYTHONWARNINGS": "default"}
    async with MCPToolset(SERVER, env=env, stderr_log=log_file, timeout_s=5) as ts:
        assert {t.name for t in ts.tools} >= {"wait", "crash"}  # env reached the server
        for _ in range(3):
            assert (await ts.call("add", {"a": "x"})).is_error
        assert (await ts.call("crash")).is_error
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    assert log_file.stat().st_size > 0  # the server wrote there (its start-up and errors)


async def test_a_temporary_stderr_log_is_kept_only_where_a_message_names_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with MCPToolset(SERVER, env={"ART_MCP_TEST_TOOLS": "1"}, timeout_s=5) as clean:
        assert (await clean.call("add", {"a": 1, "b": 2})).text == "3"
        clean_log = clean.stderr_log
        assert clean_log is not None and clean_log.exists()
    assert not clean_log.exists()  # a clean run leaves nothing in the temporary folder
    async with MCPToolset(SERVER, env={"ART_MCP_TEST_TOOLS": "1"}, timeout_s=5) as crashed:
        assert (await crashed.call("crash")).is_error
        crash_log = crashed.stderr_log
    assert crash_log is not None and crash_log.exists()  # kept for its traceback
    assert str(crash_log) in caplog.text  # the crash's warning says where it is
    crash_log.unlink()
    # a start that fails without a word on stderr, or asks for a tool the server lacks:
    # nothing names the log, so nothing is left behind
    silent = MCPToolset("python -c 'import sys; sys.exit(3)'", startup_timeout_s=20)
    with pytest.raises(art.InfrastructureError, match="exited with code 3"):
        await silent.start()
    unknown = MCPToolset(SERVER, deny_tools=["delete_all"])
    with pytest.raises(art.UsageError):
        await unknown.start()
    for toolset in (silent, unknown):
        assert toolset.stderr_log is not None and not toolset.stderr_log.exists()
    cmd = "python -c 'import sys; print(\"no key\", file=sys.stderr); sys.exit(3)'"
    failed = MCPToolset(cmd, startup_timeout_s=20)
    with pytest.raises(art.InfrastructureError) as info:
        await failed.start()
    await failed.close()
    assert failed.stderr_log is not None and str(failed.stderr_log) in str(info.value)
    assert failed.stderr_log.exists()  # the error names it, so it stays
    failed.stderr_log.unlink()


async def test_allow_and_deny_lists_choose_the_tools_offered() -> None:
    async with MCPToolset(SERVER, allow_tools=["add", "capital"], deny_tools=["capital"]) as ts:
        assert [t.name for t in ts.tools] == ["add"]
        assert [t.name for t in ts.langchain_tools()] == ["add"]
        refused = await ts.call("capital", {"country": "France"})
        assert refused.is_error and "not offered" in refused.text
        assert (await ts.call("add", {"a": 1, "b": 2})).text == "3"
    with pytest.raises(art.UsageError, match=r"no tool named 'delete_all'.*its tools: .*add"):
        await MCPToolset(SERVER, deny_tools=["delete_all"]).start()
