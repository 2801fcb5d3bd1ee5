"""A small MCP server bundled for the demo and the tests (see server.py)."""
