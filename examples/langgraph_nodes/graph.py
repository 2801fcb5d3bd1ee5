"""Train two nodes of a multi-node LangGraph app, each on its own reward (tiny preset, CPU).

    python -m examples.langgraph_nodes [--steps 4] [--out runs/langgraph_nodes]

The app: a `router` node picks a route for the question (math or weather, as structured
output); a `research` subgraph runs an `agent` node that calls the route's tool and a
`ToolNode` that runs it; a `summarise` node answers. One chat model serves every node.

Training, with two changes to a plain GRPO loop:

- `art.capture(train_nodes=["router", "agent"])`: the summariser's calls stay recorded
  (for review and judging) and do not train.
- `traj.node_rewards = {"router": ..., "agent": ...}`: the router is rewarded for the
  route, the agent for its tool call; their advantages are computed per node within the
  group, so each is trained on its own signal in the same step.

The tiny model is warm-started on tool-call demonstrations first (a random model cannot
emit a tool call). Prints, per step, the router's accuracy and the agent's reward on a
held-out set never trained on; writes `report.json` into `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from pydantic import BaseModel

import art_langgraph as art
from art_langgraph.utils import atomic_write
from examples.langgraph_agent.agent import TOOLS, task, warm_start

TRAIN_NODES = ["router", "agent"]
ROUTES = {"math": "add", "weather": "get_weather"}


class Route(BaseModel):
    """Where the question goes."""

    route: Literal["math", "weather"]


class State(MessagesState):
    route: str


def build_graph(llm: Any, checkpointer: Any = None) -> Any:
    """router -> research (agent -> tools) -> summarise, all on `llm`."""
    router_llm = llm.with_structured_output(Route, method="json_schema")
    agents = {
        route: llm.bind_tools([t for t in TOOLS if t.name == tool], tool_choice="required")
        for route, tool in ROUTES.items()
    }

    async def router(state: State) -> dict[str, Any]:
        system = SystemMessage("Is the question about math or about the weather?")
        choice = await router_llm.ainvoke([system, *state["messages"]])
        return {"route": choice.route}

    async def agent(state: State) -> dict[str, Any]:
        return {"messages": [await agents[state["route"]].ainvoke(state["messages"])]}

    research = StateGraph(State)
    research.add_node("agent", agent)
    research.add_node("tools", ToolNode(TOOLS, handle_tool_errors=True))
    research.add_edge(START, "agent")
    research.add_edge("agent", "tools")
    research.add_edge("tools", END)

    async def summarise(state: State) -> dict[str, Any]:
        system = SystemMessage("Answer the question in one sentence.")
        return {"messages": [await llm.ainvoke([system, *state["messages"]])]}

    graph = StateGraph(State)
    graph.add_node("router", router)
    graph.add_node("research", research.compile())
    graph.add_node("summarise", summarise)
    graph.add_edge(START, "router")
    graph.add_edge("router", "research")
    graph.add_edge("research", "summarise")
    graph.add_edge("summarise", END)
    return graph.compile(checkpointer=checkpointer)


def node_rewards(traj: art.Trajectory, t: dict[str, Any]) -> dict[str, float]:
    """router: 1 for the right route; agent: 1 for the right tool and arguments, 0.5 for
    the right tool only."""
    route = next((r for r, tool in ROUTES.items() if tool == t["tool"]), "")
    routed = any(c.node == "router" and route in str(c.response_message) for c in traj.calls)
    calls = [ev for ev in traj.tool_events if ev.name == t["tool"]]
    agent = 1.0 if any(ev.args == t["args"] for ev in calls) else 0.5 if calls else 0.0
    return {"router": float(routed), "agent": agent}


async def rollout(graph: Any, t: dict[str, Any]) -> art.Trajectory:
    with art.capture(metadata={"question": t["question"]}, train_nodes=TRAIN_NODES) as traj:
        try:
            await graph.ainvoke({"messages": [("user", t["question"])]})
        except Exception as exc:  # a failed run scores 0; it does not stop training
            traj.log(f"graph stopped: {exc!r}")
    traj.node_rewards = node_rewards(traj, t)
    traj.reward = statistics.fmean(traj.node_rewards.values())
    return traj


async def run(
    steps: int, out: Path, groups_per_step: int, group_size: int, seed: int, held_out_n: int = 16
) -> Any:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    held_out = [task(random.Random(20_000 + i)) for i in range(held_out_n)]
    async with art.LocalBackend(path=out / ".art") as backend:
        model = art.TrainableModel(
            name=f"nodes-{int(time.time())}", project="langgraph-nodes", base_model="tiny"
        )
        await model.register(backend)
        await warm_start(model)
        graph = build_graph(model.chat_model(max_tokens=40, temperature=0.8))

        async def evaluate() -> dict[str, float]:
            trajs = await asyncio.gather(*(rollout(graph, t) for t in held_out))
            return {n: statistics.fmean(tr.node_rewards[n] for tr in trajs) for n in TRAIN_NODES}

        rows = [{"step": 0.0, **{f"held_out_{k}": v for k, v in (await evaluate()).items()}}]
        print(f"{'step':>4} {'router (held-out)':>18} {'agent (held-out)':>17} {'trained':>8}")
        print(f"{0:>4} {rows[0]['held_out_router']:>18.2f} {rows[0]['held_out_agent']:>17.2f}")
        for _ in range(steps):
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(graph, t) for _ in range(group_size))
                    for t in [task(rng) for _ in range(groups_per_step)]
                ),
                progress=False,
            )
            result = await model.train(groups, art.TrainConfig(learning_rate=2e-3))
            held = await evaluate()
            row = {"step": float(result.step), **{f"held_out_{k}": v for k, v in held.items()}}
            row["trained_calls"] = result.metrics.get("node_advantage_calls", 0.0)
            rows.append(row)
            print(
                f"{result.step:>4} {held['router']:>18.2f} {held['agent']:>17.2f} "
                f"{int(row['trained_calls']):>8d}"
            )
    with atomic_write(out / "report.json") as f:
        json.dump({"rows": rows, "train_nodes": TRAIN_NODES}, f, indent=2)
    print(f"wrote {out / 'report.json'}")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4, help="GRPO steps (default 4)")
    p.add_argument("--groups-per-step", type=int, default=4, help="questions per step")
    p.add_argument("--group-size", type=int, default=4, help="rollouts per question")
    p.add_argument("--out", type=Path, default=Path("runs/langgraph_nodes"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--held-out", type=int, default=16, help="held-out questions (never trained)")
    a = p.parse_args(argv)
    asyncio.run(run(a.steps, a.out, a.groups_per_step, a.group_size, a.seed, a.held_out))


if __name__ == "__main__":
    main()
