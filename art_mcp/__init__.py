"""art_mcp: train an agent over any MCP server (the toolset, scenarios and harness land here).

The package exists so that `art_mcp` imports today; its public API is empty until the
MCP harness is built on top of art_langgraph.
"""

__all__: list[str] = []
