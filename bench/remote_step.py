"""One RL step through `RemoteBackend` against the same step through `LocalBackend`, side by side.

Both sides run the same loop on the tiny preset: P prompts × G concurrent chat requests
through the backend's OpenAI endpoint (C completion tokens each, `ignore_eos`), recorded
with `LLMCall.from_openai`, then `model.train(groups)`. Local: `LocalBackend` in this
process. Remote: `RemoteBackend(url)` to `art-langgraph backend` in a child process on
a loopback port (groups uploaded as gzip JSON, progress streamed back). The sides
alternate step by step (which one goes first alternates too), so a shared machine's
noise falls on both; after `--warmup` untimed steps each, `--steps` timed ones.

Reported: median seconds per full step and per `train` call, the ratio remote / local
(target ≤ 1.05 for the step), the upload's size raw and compressed, and the peak RSS of
this process (the client, which for the remote side holds no weights) and of the server.

Left out: a real network (loopback has no latency or bandwidth limit: add your RTT
× 2 per step, and upload size / bandwidth), TLS, GPUs.

    .venv/bin/python -m bench.remote_step [--prompts 4 --group-size 8 --completion-tokens 32 --steps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gzip
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import art_langgraph as art
from art_langgraph.backend.api.wire import ModelSpec, TrainRequest, encode_body
from bench.readme import ROOT, results_dir, update_docs, write_results

RESULTS = results_dir("remote_step") / "remote_step.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _step(
    model: art.TrainableModel, prompts: list[str], group_size: int, tokens: int
) -> dict[str, Any]:
    client = model.openai_client(max_retries=0)

    async def one(prompt: str, i: int) -> art.Trajectory:
        kw: dict[str, Any] = {
            "model": model.name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens,
            "logprobs": True,
            "extra_body": {"ignore_eos": True, "return_token_ids": True},
        }
        r = await client.chat.completions.create(**kw)
        call = art.LLMCall.from_openai(kw, r)
        text = r.choices[0].message.content or ""
        reward = sum(ch.isdigit() for ch in text) / max(len(text), 1) + 0.01 * (i % 2)
        return art.Trajectory(messages=call.to_messages(), calls=[call], reward=reward)

    t0 = time.perf_counter()
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(one(p, i) for i in range(group_size)) for p in prompts),
        progress=False,
    )
    t1 = time.perf_counter()
    result = await model.train(groups, art.TrainConfig(learning_rate=1e-4))
    t2 = time.perf_counter()
    body, headers = encode_body(
        TrainRequest(
            model=ModelSpec.of(model),
            groups=groups,
            config=art.TrainConfig(learning_rate=1e-4),
        )
    )
    raw = len(gzip.decompress(body)) if headers.get("content-encoding") == "gzip" else len(body)
    return {
        "wall_s": t2 - t0,
        "gather_s": t1 - t0,
        "train_call_s": t2 - t1,
        "train_s": float(result.metrics.get("step_seconds", float("nan"))),
        "upload_bytes": len(body),
        "upload_raw_bytes": raw,
        "step": result.step,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = [
        f"Task {i}: write numbers about " + "word " * (6 + 5 * i) for i in range(args.prompts)
    ]
    with tempfile.TemporaryDirectory() as d:
        port = _free_port()
        log = open(Path(d) / "backend.log", "wb")  # noqa: SIM115 (closed below)
        cmd = [sys.executable, "-m", "art_langgraph.cli", "backend", "--path", str(Path(d) / "r")]
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), "--log-level", "warning"],
            cwd=ROOT,
            stdout=log,
            stderr=log,
            env={**os.environ, "ART_API_KEY": ""},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(url + "/art/v1/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            async with art.LocalBackend(Path(d) / "local") as local:
                sides = {
                    "local": (local, art.TrainableModel(name="l", project="b", base_model="tiny")),
                    "remote": (
                        art.RemoteBackend(url),
                        art.TrainableModel(name="r", project="b", base_model="tiny"),
                    ),
                }
                for backend, model in sides.values():
                    await model.register(backend)
                rss_registered = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                steps: dict[str, list[dict[str, Any]]] = {"local": [], "remote": []}
                for i in range(args.warmup + args.steps):
                    order = ["local", "remote"] if i % 2 == 0 else ["remote", "local"]
                    for side in order:
                        s = await _step(
                            sides[side][1], prompts, args.group_size, args.completion_tokens
                        )
                        s["warmup"] = i < args.warmup
                        steps[side].append(s)
                        print(
                            f"{side:>6} step {s['step']}: {s['wall_s']:.2f} s "
                            f"(train call {s['train_call_s']:.2f} s)",
                            flush=True,
                        )
            server_rss = _child_peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()
    return {
        "steps": steps,
        "client_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "client_rss_after_register_mib": rss_registered,
        "server_peak_rss_mib": server_rss,
    }


def report(args: argparse.Namespace, res: dict[str, Any]) -> dict[str, Any]:
    med: dict[str, dict[str, float]] = {}
    for side, steps in res["steps"].items():
        timed = [s for s in steps if not s["warmup"]]
        med[side] = {
            k: statistics.median(s[k] for s in timed)
            for k in ("wall_s", "gather_s", "train_call_s", "train_s")
        }
        med[side]["best_s"] = min(s["wall_s"] for s in timed)
    upload = res["steps"]["remote"][-1]
    ratio = med["remote"]["wall_s"] / med["local"]["wall_s"]
    lines = [
        "| backend | s/step (median) | best | rollouts s | `train` call s | step inside the backend s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for side in ("local", "remote"):
        m = med[side]
        lines.append(
            f"| {'`LocalBackend` (in process)' if side == 'local' else '`RemoteBackend` → `art-langgraph backend`'} "
            f"| {m['wall_s']:.3f} | {m['best_s']:.3f} | {m['gather_s']:.3f} | {m['train_call_s']:.3f} | {m['train_s']:.3f} |"
        )
    lines += [
        "",
        f"Remote / local, full RL step: **{ratio:.3f}×** (target ≤ 1.05); `train` call: "
        f"{med['remote']['train_call_s'] / med['local']['train_call_s']:.3f}×. "
        f"Upload per step: {upload['upload_raw_bytes'] / 1024:.0f} KiB of JSON, "
        f"{upload['upload_bytes'] / 1024:.0f} KiB gzipped. Peak RSS: client "
        f"{res['client_peak_rss_mib']:.0f} MiB (it also hosts the local side), server "
        f"{res['server_peak_rss_mib']:.0f} MiB. {args.prompts} prompts × {args.group_size} rollouts × "
        f"{args.completion_tokens} tokens, tiny preset, {args.steps} timed steps per side after "
        f"{args.warmup} warm-up, alternating; {os.cpu_count()} CPUs, loopback.",
    ]
    table = "\n".join(lines)
    print(table)
    data = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "args": vars(args),
        "medians": med,
        "remote_over_local": ratio,
        **res,
        "table": table,
    }
    write_results(RESULTS, data)
    update_docs("remote_step", table)
    return data


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--completion-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    report(args, asyncio.run(run(args)))


if __name__ == "__main__":
    main()
