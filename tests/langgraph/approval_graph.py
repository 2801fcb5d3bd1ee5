"""A graph that asks a human before it runs a tool, on a real SQLite checkpointer; run as
a script it resumes a thread in a process of its own (the cross-process interrupt test).

    python -m tests.langgraph.approval_graph DB STORE THREAD BASE_URL MODEL DECISION OUT

agent (a forced tool call) -> approve (`interrupt()`) -> tools -> answer, or -> END when
the human rejects.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from langchain_core.messages import SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

import art_langgraph as art
from tests.langgraph.tools import TOOLS


def approval_graph(llm: Any, checkpointer: Any) -> Any:
    tool_llm = llm.bind_tools(TOOLS, tool_choice="required")

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await tool_llm.ainvoke(state["messages"])]}

    def approve(state: MessagesState) -> Command[Any]:
        decision = interrupt({"tool_calls": state["messages"][-1].tool_calls})
        return Command(goto="tools" if art.resume_reward(decision) > 0 else END)

    async def answer(state: MessagesState) -> dict[str, Any]:
        system = SystemMessage("Answer in one sentence.")
        return {"messages": [await llm.ainvoke([system, *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("approve", approve, destinations=("tools", END))
    graph.add_node("tools", ToolNode(TOOLS, handle_tool_errors=True))
    graph.add_node("answer", answer)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "approve")
    graph.add_edge("tools", "answer")
    graph.add_edge("answer", END)
    return graph.compile(checkpointer=checkpointer)


async def _resume(db: str, store: str, thread: str, url: str, model: str, decision: str) -> str:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from art_langgraph.runtime.http_pool import async_http_client
    from art_langgraph.tracing.chat_model import TrainableChatModel

    llm = TrainableChatModel(
        model=model,
        base_url=url,
        api_key="local",  # type: ignore[arg-type]
        max_tokens=8,
        http_async_client=async_http_client(),
    )
    config = {"configurable": {"thread_id": thread}}
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        graph = approval_graph(llm, saver)
        with art.capture(thread=config, store=store) as traj:
            await graph.ainvoke(Command(resume=decision), config)
    return traj.model_dump_json()


if __name__ == "__main__":
    *args, out = sys.argv[1:]
    with open(out, "w", encoding="utf-8") as f:
        f.write(asyncio.run(_resume(*args)))
