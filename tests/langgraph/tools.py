"""Tools shared by the LangGraph tests: the example's tools and warm start, plus a tool that fails.

The tiny preset is random; the example's short SFT on demonstrations teaches it the
tool-call format (so graphs actually call tools), as a user would warm-start a small model.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from examples.langgraph_agent.agent import TOOLS, add, demonstrations, get_weather, warm_start

__all__ = [
    "TOOLS",
    "add",
    "demonstrations",
    "explode",
    "get_weather",
    "one_tool_call_graph",
    "warm_start",
]


@tool
def explode() -> str:
    """A tool that always fails."""
    raise RuntimeError("boom: this tool always fails")


def one_tool_call_graph(llm: Any) -> Any:
    """model -> (its tool calls, run by a ToolNode that turns errors into messages) -> end.
    Bind `llm` with `tool_choice` to force the call; `explode` is among the tools."""
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda s: {"messages": [llm.invoke(s["messages"])]})
    graph.add_node("tools", ToolNode([*TOOLS, explode], handle_tool_errors=True))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    graph.add_edge("tools", END)
    return graph.compile()
