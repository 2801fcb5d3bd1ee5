"""art_mcp: train an agent over any MCP server with art_langgraph.

`MCPToolset` exposes a server's tools to LangGraph over one reused session;
`generate_scenarios` asks an LLM for tasks the tools can solve; `train` (and the
`art-mcp train` CLI) runs the whole loop: scenarios, warm start, GRPO, evaluation, report.
"""

from art_mcp.config import HarnessConfig
from art_mcp.harness import train
from art_mcp.report import Report
from art_mcp.scenarios import (
    Scenario,
    generate_scenarios,
    load_scenarios,
    save_scenarios,
    split_scenarios,
)
from art_mcp.toolset import MCPToolset, ToolOutcome

__all__ = [
    "HarnessConfig",
    "MCPToolset",
    "Report",
    "Scenario",
    "ToolOutcome",
    "generate_scenarios",
    "load_scenarios",
    "save_scenarios",
    "split_scenarios",
    "train",
]
