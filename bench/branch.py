"""Branching a group from a saved state vs rolling the whole group out from the start.

A 6-step agent graph (each step one chat-model call that appends its reply to the
messages; a system prompt and a task of ~`--prompt-words` words first) on the tiny
preset served by an embedded `art.LocalBackend`, `--max-tokens` (16) completion tokens
a call, temperature 1, an AsyncSqliteSaver in a temp file. The branch point is step 5:
one saved run of the thread (not timed: it is the run being branched from) gives the
checkpoint step 5 started from. Two ways to get a group of n rollouts to compare, side
by side in one run, interleaved repeat by repeat so the machine's noise falls on both:

- `full`: n rollouts of the graph from the start, each on a thread of its own, in
  `asyncio.gather` (each inside `art.capture()`);
- `branch`: `art_langgraph.gathering.branch.branch(graph, config, n)` from the checkpoint before
  step 5: steps 5 and 6 only, the history shared.

Per group: wall time (median over `--repeats`), and the tokens the trainer computes:
the packed micro-batch tokens of `prepare_step` + `micro_batches` with the default
`TrainConfig` (prefix sharing on: a group's shared prompt counted once), and the
trainable (sampled) tokens; `full / branch` ratios.

Left out: the GRPO step itself (its time follows the packed tokens) and what the two
groups teach (the full group trains steps 1-6, the branch group steps 5-6 of one
situation).

    .venv/bin/python -m bench.branch [--n 4,8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

import art_langgraph as art
from art_langgraph.gathering.branch import branch
from art_langgraph.training.config import TrainConfig
from art_langgraph.training.prepare import prepare_step
from art_langgraph.training.tensorize import micro_batches
from bench.readme import results_dir, update_docs, write_results

RESULTS = results_dir("branch") / "branch.json"
STEPS = 6
BRANCH_STEP = 5


def agent_graph(llm: Any, checkpointer: Any) -> Any:
    """step1 -> ... -> step6 -> end; each step appends the model's reply."""
    graph = StateGraph(MessagesState)

    async def call(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    for k in range(1, STEPS + 1):
        graph.add_node(f"step{k}", call)
        graph.add_edge(START if k == 1 else f"step{k - 1}", f"step{k}")
    graph.add_edge(f"step{STEPS}", END)
    return graph.compile(checkpointer=checkpointer)


def first_input(words: int) -> dict[str, Any]:
    system = "You are a careful research agent. " + " ".join(
        f"Rule {i}: check every source twice and write down what you found."
        for i in range(words // 11)
    )
    return {"messages": [("system", system), ("user", "Find out when the lighthouse was built.")]}


def trainer_tokens(group: art.TrajectoryGroup) -> dict[str, int]:
    """What the trainer computes for this group alone: packed tokens and trainable tokens."""
    for i, traj in enumerate(group):
        traj.reward = float(i)  # any spread: a zero-variance group would be skipped
    config = TrainConfig()
    seqs, _ = prepare_step([group], config, 1)
    packed = sum(
        mb.real_tokens
        for mb in micro_batches(
            seqs,
            row_length=config.max_seq_length,
            micro_batch_tokens=config.micro_batch_tokens,
            pack=config.pack_sequences,
            share_prefixes=config.share_prefixes,
        )
    )
    return {
        "packed_tokens": packed,
        "sequence_tokens": sum(len(s) for s in seqs),
        "trainable_tokens": sum(s.num_trainable for s in seqs),
        "calls": sum(len(t.calls) for t in group),
    }


async def bench(ns: list[int], repeats: int, max_tokens: int, prompt_words: int) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            art.LocalBackend(path=Path(tmp) / "backend") as backend,
            AsyncSqliteSaver.from_conn_string(str(Path(tmp) / "ckpt.sqlite")) as saver,
        ):
            model = art.TrainableModel(name="bench", project="branch", base_model="tiny")
            await model.register(backend)
            llm = model.chat_model(max_tokens=max_tokens, temperature=1.0)
            app = agent_graph(llm, saver)
            start = first_input(prompt_words)
            counter = iter(range(10**9))

            async def full(n: int) -> art.TrajectoryGroup:
                async def one() -> art.Trajectory:
                    cfg = {"configurable": {"thread_id": f"full-{next(counter)}"}}
                    with art.capture() as traj:
                        await app.ainvoke(start, cfg)
                    return traj

                return await art.TrajectoryGroup(one() for _ in range(n)).resolve()

            # The saved run to branch from, and the checkpoint step 5 started from.
            t0 = time.perf_counter()
            with art.capture() as saved:
                await app.ainvoke(start, {"configurable": {"thread_id": "saved"}})
            saved_s = time.perf_counter() - t0
            call = next(c for c in saved.calls if c.node == f"step{BRANCH_STEP}")
            at = {"configurable": {"thread_id": "saved", "checkpoint_id": call.checkpoint_id}}
            history_tokens = len(call.prompt_token_ids or [])

            paths = {"full": full, "branch": lambda n: branch(app, at, n)}
            for fn in paths.values():  # warm-up
                await fn(2)
            for n in ns:
                times: dict[str, list[float]] = {k: [] for k in paths}
                tokens: dict[str, list[dict[str, int]]] = {k: [] for k in paths}
                for r in range(repeats):
                    order = list(paths.items())
                    order = order[r % 2 :] + order[: r % 2]  # alternate who goes first
                    for name, fn in order:
                        t = time.perf_counter()
                        group = await fn(n)
                        times[name].append(time.perf_counter() - t)
                        assert len(group) == n and not group.exceptions, group.exceptions
                        tokens[name].append(trainer_tokens(group))
                for name in paths:
                    rows[f"{name}-{n}"] = {
                        "path": name,
                        "n": n,
                        "wall_s": statistics.median(times[name]),
                        "wall_s_all": times[name],
                        **{
                            k: statistics.median(t[k] for t in tokens[name])
                            for k in tokens[name][0]
                        },
                    }
    return {
        "benchmark": "branch",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "settings": {
            "ns": ns,
            "repeats": repeats,
            "steps": STEPS,
            "branch_step": BRANCH_STEP,
            "max_tokens": max_tokens,
            "prompt_words": prompt_words,
            "model": "tiny preset, embedded LocalBackend (torch engine, CPU)",
            "checkpointer": "AsyncSqliteSaver (temp file)",
        },
        "saved_run_s": saved_s,
        "history_tokens": history_tokens,
        "rows": rows,
    }


def table(r: dict[str, Any]) -> str:
    s = r["settings"]
    out = [
        f"machine: {r['machine']['cores']} cores, Python {r['machine']['python']}; tiny preset, "
        f"{s['steps']}-step graph, {s['max_tokens']} tokens a call, branch before step "
        f"{s['branch_step']} ({r['history_tokens']} tokens of history); median of "
        f"{s['repeats']} groups each",
        "",
        "| n | path | wall s/group | calls | packed tokens | unshared tokens | trainable tokens |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for n in s["ns"]:
        f, b = r["rows"][f"full-{n}"], r["rows"][f"branch-{n}"]
        for row in (f, b):
            out.append(
                f"| {n} | {row['path']} | {row['wall_s']:.2f} | {row['calls']:.0f} | "
                f"{row['packed_tokens']:.0f} | {row['sequence_tokens']:.0f} | "
                f"{row['trainable_tokens']:.0f} |"
            )
        out.append(
            f"| {n} | full / branch | {f['wall_s'] / b['wall_s']:.2f}x | "
            f"{f['calls'] / b['calls']:.2f}x | {f['packed_tokens'] / b['packed_tokens']:.2f}x | "
            f"{f['sequence_tokens'] / b['sequence_tokens']:.2f}x | "
            f"{f['trainable_tokens'] / b['trainable_tokens']:.2f}x |"
        )
    out += [
        "",
        "packed tokens: what the trainer computes (prefix sharing on: a prompt the group "
        "shares, the system prompt or the whole history, once); unshared: the sum of the "
        f"sequences' lengths. The saved run branched from took {r['saved_run_s']:.2f} s "
        "(not counted).",
    ]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", default="4,8", help="group sizes, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt-words", type=int, default=200)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    ns = [int(x) for x in a.n.split(",")]
    r = asyncio.run(bench(ns, a.repeats, a.max_tokens, a.prompt_words))
    r["markdown"] = table(r)
    print(r["markdown"])
    write_results(a.out, r)
    if a.out == RESULTS and update_docs("branch", r["markdown"]):
        print("updated docs/benchmarks.md")


if __name__ == "__main__":
    main()
