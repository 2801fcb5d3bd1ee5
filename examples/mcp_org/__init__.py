"""The org-chart MCP server and its two-hop task (issue 54)."""
