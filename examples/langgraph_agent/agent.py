"""Train a LangGraph agent with two tools (add, get_weather) on the tiny preset, on a CPU.

    python -m examples.langgraph_agent [--steps 6] [--out runs/langgraph_agent] [--backend URL]

1. Start the embedded backend (or, with `--backend URL`, use an `art-langgraph backend`
   server: the one line that changes is `LocalBackend()` -> `RemoteBackend(url)`) and
   register a trainable model (the tiny preset).
2. Warm-start it with a short SFT on tool-call demonstrations: a random model cannot
   emit the tool-call format at all, so RL would have nothing to reward.
3. The agent is an ordinary `langchain.agents.create_agent` graph; the only change to
   it is `model.chat_model()` as its model. Each rollout runs inside `art.capture()`,
   which records every LLM call (token ids, logprobs, serving step) and tool call.
4. A programmatic reward: 1.0 when the final answer holds the right result, 0.5 when a
   tool was called with the right arguments, else 0.
5. GRPO steps: gather groups, `model.train(groups)`; the graph compiled at the start
   keeps running and serves each new adapter. Prints a per-step table and writes a
   reward-curve PNG and a JSON report into `--out`.

The tiny model is small and random before the warm start: expect a noisy curve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import time
from pathlib import Path
from typing import Annotated, Any

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

import art_langgraph as art
from art_langgraph.utils import atomic_write

CITIES = ["Paris", "Lyon", "Oslo", "Rome", "Lima", "Kyiv"]


@tool
def add(a: Annotated[int, Field(ge=0, le=999)], b: Annotated[int, Field(ge=0, le=999)]) -> int:
    """Add two integers."""
    return a + b


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"18 C and sunny in {city}"


TOOLS = [add, get_weather]


def task(rng: random.Random) -> dict[str, Any]:
    """A question and what a good answer holds."""
    if rng.random() < 0.5:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return {
            "question": f"What is {a} plus {b}?",
            "tool": "add",
            "args": {"a": a, "b": b},
            "answer": str(a + b),
        }
    city = rng.choice(CITIES)
    return {
        "question": f"How is the weather in {city}?",
        "tool": "get_weather",
        "args": {"city": city},
        "answer": f"18 C and sunny in {city}",
    }


def demonstrations(n: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    """Conversations: question -> tool call -> tool result -> short answer."""
    rng = random.Random(seed)
    tools = [convert_to_openai_tool(t) for t in TOOLS]
    out = []
    for i in range(n):
        t = task(rng)
        result = t["answer"]
        answer = f"The answer is {result}." if t["tool"] == "add" else f"It is {result}."
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": t["tool"], "arguments": json.dumps(t["args"])},
        }
        messages = [
            {"role": "user", "content": t["question"]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": result},
            {"role": "assistant", "content": answer},
        ]
        out.append({"messages": messages, "tools": tools})
    return out


async def warm_start(model: art.TrainableModel, epochs: int = 20) -> art.TrainResult:
    """Teach the tiny model the tool-call format (~20 s on 2 CPU cores)."""
    return await model.train_sft(
        demonstrations(), art.TrainConfig(learning_rate=1e-2), epochs=epochs, batch_size=8
    )


def score(traj: art.Trajectory, t: dict[str, Any]) -> float:
    """1.0: the final answer holds the result; 0.5: the right tool with the right arguments."""
    final = next((m for m in reversed(traj.messages) if m.get("role") == "assistant"), {})
    text = str(final.get("content") or "")
    if t["answer"] in text or (t["tool"] == "add" and re.search(rf"\b{t['answer']}\b", text)):
        return 1.0
    if any(
        ev.name == t["tool"] and ev.args == t["args"] and ev.error is None
        for ev in traj.tool_events
    ):
        return 0.5
    return 0.0


async def rollout(agent: Any, t: dict[str, Any]) -> art.Trajectory:
    with art.capture(metadata={"question": t["question"]}) as traj:
        try:
            await agent.ainvoke({"messages": [("user", t["question"])]}, {"recursion_limit": 8})
        except (
            Exception
        ) as exc:  # a run past the recursion limit scores 0, it does not stop training
            traj.log(f"agent stopped: {exc!r}")
    traj.reward = score(traj, t)
    return traj


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(
        [r["step"] for r in rows],
        [r["reward"] for r in rows],
        marker="o",
        label="train reward (mean)",
    )
    ax.plot(
        [r["step"] for r in rows],
        [r["val_reward"] for r in rows],
        marker="s",
        label="held-out reward",
    )
    ax.set_xlabel("step (adapter serving the rollouts)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("reward")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("LangGraph agent, tiny preset, GRPO")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)


async def run(
    steps: int,
    out: Path,
    groups_per_step: int,
    group_size: int,
    seed: int,
    backend_url: str | None = None,
    engine: str = "auto",
) -> list[dict[str, float]]:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    val = [task(random.Random(10_000 + i)) for i in range(16)]
    backend: art.LocalBackend | art.RemoteBackend = (
        art.RemoteBackend(backend_url, api_key=os.environ.get("ART_API_KEY"))
        if backend_url
        else art.LocalBackend(path=out / ".art", engine=engine)  # type: ignore[arg-type]
    )
    async with backend:
        model = art.TrainableModel(
            name=f"agent-{int(time.time())}", project="langgraph-agent", base_model="tiny"
        )
        await model.register(backend)
        sft = await warm_start(model)
        print(
            f"warm start: SFT loss {sft.metrics['sft_loss_first']:.2f} -> {sft.metrics['sft_loss_last']:.2f}"
        )
        agent = create_agent(
            model.chat_model(max_tokens=48, temperature=0.7), tools=TOOLS
        )  # compiled once
        rows: list[dict[str, float]] = []
        print(
            f"{'step':>4} {'served':>22} {'reward':>7} {'held-out':>8} {'tools ok':>8} {'seconds':>7}"
        )
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = [task(rng) for _ in range(groups_per_step)]
            groups = await art.gather_trajectory_groups(
                (art.TrajectoryGroup(rollout(agent, t) for _ in range(group_size)) for t in batch),
                progress=False,
            )
            val_trajs = await asyncio.gather(*(rollout(agent, t) for t in val))
            served = (
                groups[0].trajectories[0].calls[0].model
                if groups and groups[0].trajectories
                else "?"
            )
            rewards = [tr.reward for g in groups for tr in g]
            ok = sum(1 for g in groups for tr in g for ev in tr.tool_events if ev.error is None)
            result = await model.train(groups, art.TrainConfig(learning_rate=2e-3))
            row = {
                "step": float(result.step - 1),
                "reward": sum(rewards) / max(len(rewards), 1),
                "val_reward": sum(tr.reward for tr in val_trajs) / len(val_trajs),
                "tool_calls_ok": float(ok),
                "seconds": time.perf_counter() - t0,
            }
            rows.append(row)
            print(
                f"{int(row['step']):>4} {served:>22} {row['reward']:>7.3f} {row['val_reward']:>8.3f} "
                f"{ok:>8d} {row['seconds']:>7.1f}"
            )
    plot(rows, out / "reward_curve.png")
    with atomic_write(out / "report.json") as f:
        json.dump({"rows": rows, "steps": steps}, f, indent=2)
    print(f"wrote {out / 'reward_curve.png'} and {out / 'report.json'}")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="GRPO steps (default 6)")
    p.add_argument("--groups-per-step", type=int, default=4, help="questions per step")
    p.add_argument("--group-size", type=int, default=6, help="rollouts per question")
    p.add_argument(
        "--out", type=Path, default=Path("runs/langgraph_agent"), help="where the report goes"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--backend",
        default=None,
        help="URL of an `art-langgraph backend` server (key: $ART_API_KEY); default: embedded",
    )
    p.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "torch", "vllm"],
        help="the embedded backend's engine (vllm: scripts/setup-vllm.sh)",
    )
    a = p.parse_args(argv)
    asyncio.run(run(a.steps, a.out, a.groups_per_step, a.group_size, a.seed, a.backend, a.engine))


if __name__ == "__main__":
    main()
