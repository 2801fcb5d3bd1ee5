"""Tools shared by the LangGraph tests: the example's tools and warm start, plus a tool that fails.

The tiny preset is random; the example's short SFT on demonstrations teaches it the
tool-call format (so graphs actually call tools), as a user would warm-start a small model.
"""

from __future__ import annotations

from langchain_core.tools import tool

from examples.langgraph_agent.agent import TOOLS, add, demonstrations, get_weather, warm_start

__all__ = ["TOOLS", "add", "demonstrations", "explode", "get_weather", "warm_start"]


@tool
def explode() -> str:
    """A tool that always fails."""
    raise RuntimeError("boom: this tool always fails")
