"""art_mcp: train an agent over any MCP server with art_langgraph.

`MCPToolset` exposes a server's tools to LangGraph over one reused session.
"""

from art_mcp.toolset import MCPToolset, ToolOutcome

__all__ = ["MCPToolset", "ToolOutcome"]
