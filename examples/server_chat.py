"""The main job for now: serve the tiny preset and run a short scripted, tool-using chat.

    ./scripts/demo.sh            # set-up + this script
    python -m examples.server_chat --port 0 --turns 3

It starts the OpenAI-compatible server on the embedded torch engine (CPU, tiny preset
model built offline), then, with the real `openai` client, asks a question with two
tools. The first turn forces a tool call (`tool_choice="required"`, decoded under a
grammar, so even the untrained model emits a valid call); the script runs the tool and
sends the result back; later turns let the model choose. Every turn prints what was
served: `model@step`, the token ids' lengths and the mean logprob, which is what the
trainer will consume. The tiny model is random, so its words are noise; training comes
in a later release of this demo.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from openai import OpenAI

from art_langgraph.engine import TorchEngine
from art_langgraph.serving import ModelRegistry, start_server

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                    "b": {"type": "integer", "minimum": -1000, "maximum": 1000},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 24}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]


def run_tool(name: str, arguments: str) -> str:
    """The tools, executed locally; errors go back to the model as text."""
    try:
        args = json.loads(arguments)
        if name == "add":
            return str(int(args["a"]) + int(args["b"]))
        if name == "get_weather":
            return f"It is 18 C and sunny in {args['city']}."
        return f"error: unknown tool {name!r}"
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0, help="port to serve on (0: a free one)")
    p.add_argument("--turns", type=int, default=3, help="assistant turns to run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    engine = TorchEngine.from_pretrained("tiny")
    handle = start_server(engine, ModelRegistry("tiny"), port=args.port)
    print(
        f"serving the tiny preset at {handle.base_url} ({time.perf_counter() - t0:.1f} s to start)"
    )
    client = OpenAI(base_url=handle.base_url, api_key="local", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful assistant. Use the tools."},
        {"role": "user", "content": "What is 17 + 25, and how is the weather in Lyon?"},
    ]
    print(f"\nuser: {messages[-1]['content']}")
    try:
        for turn in range(args.turns):
            t = time.perf_counter()
            r = client.chat.completions.create(
                model="tiny",
                messages=messages,
                tools=TOOLS,  # type: ignore[arg-type]
                tool_choice="required" if turn == 0 else "auto",
                max_tokens=48,
                seed=args.seed + turn,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
            dt = time.perf_counter() - t
            choice = r.choices[0]
            n_prompt = len((r.model_extra or {}).get("prompt_token_ids", []))
            ids = (choice.model_extra or {}).get("token_ids", [])
            lps = [x.logprob for x in (choice.logprobs.content or [])] if choice.logprobs else []
            mean_lp = sum(lps) / len(lps) if lps else float("nan")
            print(
                f"\n[{r.model}] turn {turn + 1}: {n_prompt} prompt + {len(ids)} completion tokens, "
                f"mean logprob {mean_lp:.2f}, finish={choice.finish_reason}, {dt * 1000:.0f} ms"
            )
            messages.append(choice.message.model_dump(exclude_none=True))
            if choice.message.tool_calls:
                for call in choice.message.tool_calls:
                    fn = call.function  # type: ignore[union-attr]
                    result = run_tool(fn.name, fn.arguments)
                    print(f"assistant -> {fn.name}({fn.arguments})\ntool: {result}")
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            else:
                print(f"assistant: {choice.message.content!r}")
                break
    finally:
        handle.stop()
        engine.close_sync()
    print(f"\ndone in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
