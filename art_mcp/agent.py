"""The agent `art_mcp.train` trains: its system prompt, its extra tool, what it answered.

A LangGraph agent (`create_agent`) over the server's tools plus `complete_task(answer)`,
a tool that ends the run (`complete_task_tool`); with `tool_choice="required"` every model
turn is exactly one tool call (`force_tool_calls`). `final_answer` reads the answer back
from a trajectory; `demonstrations` renders SFT items the way the agent sees its
conversations (the system prompt and tool specs), for the warm start.

Left out: building the agent and running rollouts (harness.py); scoring them
(scoring.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import art_langgraph as art
from art_langgraph.errors import UsageError
from art_mcp.scenarios import Scenario

SYSTEM = (
    "You are an agent that solves the user's task with the tools you have. Call tools as needed, "
    "then call complete_task with the final answer."
)


def complete_task_tool() -> Any:
    """The `complete_task(answer)` tool: calling it ends the run (`return_direct`)."""
    from langchain_core.tools import tool

    @tool(return_direct=True)
    def complete_task(answer: str) -> str:
        """Finish the task and give the final answer."""
        return answer

    return complete_task


def force_tool_calls(max_turns: int | None = None, *, required: bool = True) -> Any:
    """Agent middleware that sets each model turn's `tool_choice`. `required`: every turn is
    exactly one tool call (the server constrains it to the tools' schemas). `max_turns`:
    the last turn may only call `complete_task`, so a rollout that runs out of turns still
    ends with an answer (LangChain's `early_stopping_method="generate"`); None: no such
    turn."""
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import AIMessage

    @wrap_model_call  # type: ignore[arg-type]
    async def force(request: Any, handler: Any) -> Any:
        turn = sum(isinstance(m, AIMessage) for m in request.messages)
        if max_turns is not None and turn >= max_turns - 1:
            choice: Any = "complete_task"
        elif required:
            choice = "required"
        else:
            return await handler(request)
        settings = {**request.model_settings, "parallel_tool_calls": False}
        return await handler(request.override(tool_choice=choice, model_settings=settings))

    return force


def final_answer(traj: art.Trajectory) -> str:
    """The answer given to complete_task, else the last assistant text."""
    for ev in reversed(traj.tool_events):
        if ev.name == "complete_task" and isinstance(ev.args, dict):
            return str(ev.args.get("answer", ""))
    for m in reversed(traj.messages):
        if m.get("role") == "assistant" and m.get("content"):
            return str(m["content"])
    return ""


def demonstrations(
    sft: list[Any] | str | Path | None, scen: list[Scenario], tools: list[Any]
) -> list[Any]:
    """SFT items: the given ones (a list or a JSONL file), else the train scenarios'
    demonstrations. A conversation without its own `tools` is rendered with the agent's
    system prompt and tool specs, so the warm start sees exactly what the agent will."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    specs = [convert_to_openai_tool(t) for t in tools]

    def agent_view(item: Any) -> Any:
        if isinstance(item, dict) and "tools" in item:
            return item  # a full item (messages + tools): used as it is
        messages = list(item["messages"] if isinstance(item, dict) else item)
        if not messages or messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": SYSTEM})
        return {"messages": messages, "tools": specs}

    if isinstance(sft, str | Path):
        lines = Path(sft).read_text().splitlines()
        try:
            sft = [json.loads(line) for line in lines if line.strip()]
        except ValueError as exc:
            raise UsageError(f"{sft}: not JSONL ({exc})") from None
    if sft is not None:
        return [agent_view(item) for item in sft]
    return [agent_view(s.demonstration) for s in scen if s.demonstration]
