"""The README's swap-in, as it runs: one GRPO step on a LangGraph agent's own chat model.

    python -m examples.swap_in

The README shows the code below this docstring, line for line (tests/test_examples.py
holds the two together and runs this file). It trains SmolLM2-135M-Instruct (the
`smollm2-135m` preset) for one step on one question; `examples/langgraph_agent` is the
whole loop, with tools, held-out evaluation and a report.
"""

import asyncio

from langchain.agents import create_agent

import art_langgraph as art


def score(trajectory: art.Trajectory, output: dict) -> float:  # your reward, or RULER
    return float("Canberra" in output["messages"][-1].content)


async def main() -> None:
    model = art.TrainableModel(name="agent", project="readme", base_model="smollm2-135m")
    await model.register(art.LocalBackend())  # the engine and the trainer, in this process
    graph = create_agent(model.chat_model(), tools=[])  # your graph; only its model is ours
    group = await art.rollouts(graph, {"messages": "Capital of Australia?"}, 8, reward=score)
    print(await model.train([group]))  # one GRPO step; the graph now runs the new adapter


asyncio.run(main())
