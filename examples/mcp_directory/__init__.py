"""A staff-directory MCP server and its generated scenarios: the real model's main job."""
