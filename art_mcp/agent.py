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

from pathlib import Path
from typing import Any

from pydantic import RootModel

import art_langgraph as art
from art_langgraph.trajectories.records import read_records
from art_langgraph.trajectories.tool_calls import tool_call_key
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


def force_tool_calls(
    max_turns: int | None = None, *, required: bool = True, after_repeat: str = "allow"
) -> Any:
    """Agent middleware that sets each model turn's `tool_choice`. `required`: every turn is
    exactly one tool call (the server constrains it to the tools' schemas). `max_turns`:
    the last turn may only call `complete_task`, so a rollout that runs out of turns still
    ends with an answer (LangChain's `early_stopping_method="generate"`); None: no such
    turn. `after_repeat` (`HarnessConfig.after_repeat`): after a turn whose calls all repeat
    earlier calls of the rollout (name and arguments), "answer" lets the next turn call only
    `complete_task`, "switch" any tool but the repeated ones (`allowed_tools`: the prompt
    keeps them all), "allow" any."""
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import AIMessage

    @wrap_model_call  # type: ignore[arg-type]
    async def force(request: Any, handler: Any) -> Any:
        turns = [m for m in request.messages if isinstance(m, AIMessage)]
        repeated = after_repeat != "allow" and repeated_last_call(turns)
        tools = request.tools
        if (max_turns is not None and len(turns) >= max_turns - 1) or (
            repeated and after_repeat == "answer"
        ):
            choice: Any = "complete_task"
        elif required or repeated:
            choice = "required"
            if repeated:  # "switch": the repeated calls' tools may not be called this turn
                again = {c["name"] for c in turns[-1].tool_calls}
                choice = allowed_tools([n for t in tools if (n := _tool_name(t)) not in again])
        else:
            return await handler(request)
        settings = {**request.model_settings, "parallel_tool_calls": False}
        return await handler(
            request.override(tools=tools, tool_choice=choice, model_settings=settings)
        )

    return force


def allowed_tools(names: list[str]) -> Any:
    """OpenAI's `allowed_tools` tool choice: one or more calls, each of a tool `names`
    lists, while the prompt still shows every tool, so this turn's prompt extends the last
    one's and its prefix stays cached (leaving the tools out re-rendered the whole
    conversation after the tool specs: half the prompt tokens an untrained evaluation of
    the capitals task computed). "required" when `names` is empty."""
    if not names:
        return "required"
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": tools}}


def _tool_name(tool: Any) -> str:
    """A LangChain tool's name, or an OpenAI tool dict's."""
    if isinstance(tool, dict):
        return str(tool.get("function", tool).get("name", ""))
    return str(tool.name)


def repeated_last_call(turns: list[Any]) -> bool:
    """Whether the last of `turns` (AI messages) made only calls an earlier turn made too,
    name and arguments alike."""
    if not turns or not turns[-1].tool_calls:
        return False
    earlier = {call_key(c["name"], c.get("args")) for m in turns[:-1] for c in m.tool_calls}
    return all(call_key(c["name"], c.get("args")) in earlier for c in turns[-1].tool_calls)


call_key = tool_call_key
"""One tool call's identity, name and arguments, for spotting a repeated call (the trainer's
`repeated_calls` reads rollouts with the same key)."""


def final_answer(traj: art.Trajectory) -> str:
    """The answer given to complete_task, else the last assistant text."""
    for ev in reversed(traj.tool_events):
        if ev.name == "complete_task" and isinstance(ev.args, dict):
            return str(ev.args.get("answer", ""))
    for m in reversed(traj.messages):
        if m.get("role") == "assistant" and m.get("content"):
            return str(m["content"])
    return ""


class SFTConversation(RootModel[list[dict[str, Any]] | dict[str, Any]]):
    """One line of an SFT file: a conversation's messages, or {"messages": ..., "tools": ...}."""


def _sft_hint(line: str) -> str:
    return ' (each line is a conversation: a JSON list of messages, or {"messages": [...]})'


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
        sft = [c.root for c in read_records(sft, SFTConversation, hint=_sft_hint)]
    if sft is not None:
        return [agent_view(item) for item in sft]
    return [agent_view(s.demonstration) for s in scen if s.demonstration]
