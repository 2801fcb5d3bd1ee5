"""Tools, demonstrations and an SFT warm start shared by the LangGraph tests and the example.

The tiny preset is random; a short SFT on these demonstrations teaches it the tool-call
format (so graphs actually call tools), as a user would warm-start a small model.
"""

from __future__ import annotations

import json
import random
from typing import Annotated, Any

from langchain_core.tools import tool
from pydantic import Field

import art_langgraph as art


@tool
def add(a: Annotated[int, Field(ge=0, le=999)], b: Annotated[int, Field(ge=0, le=999)]) -> int:
    """Add two integers."""
    return a + b


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"18 C and sunny in {city}"


@tool
def explode() -> str:
    """A tool that always fails."""
    raise RuntimeError("boom: this tool always fails")


TOOLS = [add, get_weather]


def _schema(t: Any) -> dict[str, Any]:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return convert_to_openai_tool(t)


def demonstrations(n: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    """Conversations: question -> tool call -> tool result -> short answer."""
    rng = random.Random(seed)
    tools = [_schema(t) for t in TOOLS]
    out = []
    for i in range(n):
        if i % 2 == 0:
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            q, name, args, result = f"What is {a} plus {b}?", "add", {"a": a, "b": b}, str(a + b)
            answer = f"The answer is {a + b}."
        else:
            city = rng.choice(["Paris", "Lyon", "Oslo", "Rome", "Lima", "Kyiv"])
            q, name, args, result = (
                f"How is the weather in {city}?",
                "get_weather",
                {"city": city},
                f"18 C and sunny in {city}",
            )
            answer = f"It is 18 C and sunny in {city}."
        call_id = f"call_{i}"
        messages = [
            {"role": "user", "content": q},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "assistant", "content": answer},
        ]
        out.append({"messages": messages, "tools": tools})
    return out


async def warm_start(model: art.TrainableModel) -> art.TrainResult:
    """Teach the tiny model the tool-call format (a few seconds on a CPU)."""
    return await model.train_sft(
        demonstrations(), art.TrainConfig(learning_rate=1e-2), epochs=20, batch_size=8
    )
