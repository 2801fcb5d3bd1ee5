"""The vLLM engine for real: vLLM's CPU build as a managed subprocess behind our server.

One `LocalBackend(engine="vllm")` on the real preset (fp32) serves the module: a full
GRPO step with verified swap, parity of logprobs with our torch engine, constraints
through vLLM's structured outputs, a failed load that fails loudly, prefix caching seen in
`cached_tokens` and `metrics()`, and a crashed vLLM that is restarted with its adapters.
Then a vLLM whose starter exits without `close()`, or is SIGKILLed, must not outlive it
nor leave its temporary files;
and `art-mcp train --engine vllm` end to end.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import art_langgraph as art
from art_langgraph.engine.base import GenerateResult, SamplingParams
from art_langgraph.engine.vllm_config import VLLMEngineConfig
from art_langgraph.engine.vllm_engine import VLLMEngine, to_lark
from art_langgraph.errors import InfrastructureError

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PARITY_TOL = 2e-3
"""Largest |logprob(vLLM) - logprob(torch engine)| allowed on the same tokens, fp32. Measured
on SmolLM2-135M with a trained adapter, 3 prompts x 16 greedy tokens (44 compared): max 1.5e-5 (see the
README); the bound leaves 100x for other CPUs' kernels."""


@pytest.fixture(scope="module")
async def vllm_model(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[art.LocalBackend, art.TrainableModel]]:
    path = tmp_path_factory.mktemp("vllm")
    config = VLLMEngineConfig(dtype="float32")
    async with art.LocalBackend(path, engine=art.EngineChoice("vllm", config=config)) as backend:
        model = art.TrainableModel(name="v", project="p", base_model="smollm2-135m")
        await model.register(backend)
        yield backend, model


async def _rollout(model: art.TrainableModel, i: int) -> art.Trajectory:
    client = model.openai_client()
    with art.capture() as traj:
        r = await client.chat.completions.create(
            model=model.name,
            messages=[{"role": "user", "content": f"Name a number between {i} and {i + 9}."}],
            max_tokens=10,
            seed=i,
        )
    text = r.choices[0].message.content or ""
    traj.reward = float(any(ch.isdigit() for ch in text)) + 0.1 * (i % 2)
    return traj


async def test_a_grpo_step_with_vllm_serving(
    vllm_model: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, model = vllm_model
    assert isinstance(backend.engine, VLLMEngine)
    groups = [art.TrajectoryGroup([await _rollout(model, 4 * g + i) for i in range(4)]) for g in range(2)]  # fmt: skip
    call = groups[0].trajectories[0].calls[0]
    assert call.model == "v@0" and call.completion_token_ids and call.trainable
    result = await model.train(groups, art.TrainConfig(learning_rate=1e-4))
    assert result.step == 1
    # The trainer scored exactly the tokens vLLM sampled: none re-tokenized, and its logprobs
    # agree with vLLM's (a shifted or different token would differ by whole nats).
    assert result.metrics["tensorize/retokenized_calls"] == 0
    assert result.metrics["mismatch/abs_diff_max"] < PARITY_TOL
    # The swap took: vLLM lists the new folder for v@1, and the next answer says so.
    assert (await _rollout(model, 99)).calls[0].model == "v@1"
    assert "v@1" in backend.engine.list_adapters()


async def test_logprobs_match_the_torch_engine(
    vllm_model: tuple[art.LocalBackend, art.TrainableModel], tmp_path: Path
) -> None:
    from art_langgraph.engine.torch_engine import TorchEngine, TorchEngineConfig

    backend, model = vllm_model
    step = await model.get_step()
    adapter = model.inference_name(step)
    folder = str(backend.path / "p" / "models" / "v" / "checkpoints" / f"{step:04d}")
    gc.collect()  # a closed SmolLM2 server of an earlier file on this worker goes first
    torch_engine = TorchEngine.from_pretrained("smollm2-135m", TorchEngineConfig(dtype="float32"))
    try:
        await torch_engine.load_adapter(adapter, folder)
        worst, compared = 0.0, 0
        for prompt in ("What is 2 + 2?", "Name a colour.", "Say hello in French."):
            ids = backend.engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            ids = [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]
            greedy = SamplingParams(max_tokens=16, temperature=0.0, seed=0)
            a = await backend.engine.generate(ids, greedy, adapter)
            b = await torch_engine.generate(ids, greedy, adapter)
            same = 0
            while same < min(len(a.completion_token_ids), len(b.completion_token_ids)):
                if a.completion_token_ids[same] != b.completion_token_ids[same]:
                    break
                same += 1
            assert same >= 8, (prompt, a.completion_token_ids, b.completion_token_ids)
            diffs = [abs(x - y) for x, y in zip(a.logprobs[:same], b.logprobs[:same], strict=True)]
            worst, compared = max(worst, *diffs), compared + same
        print(f"parity: {compared} tokens, max |diff| {worst:.2e}")
        assert worst < PARITY_TOL
    finally:
        await torch_engine.close()


async def test_forced_tool_calls_and_json_go_to_vllms_structured_outputs(
    vllm_model: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    _, model = vllm_model
    client = model.openai_client()
    tool: Any = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
            },
        },
    }
    r = await client.chat.completions.create(
        model=model.name,
        messages=[{"role": "user", "content": "Look up Paris."}],
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "lookup" and "city" in json.loads(call.function.arguments)  # type: ignore[union-attr]
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "maximum": 1000}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = await client.chat.completions.create(
        model=model.name,
        messages=[{"role": "user", "content": "A number as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        max_tokens=30,
        temperature=0,
    )
    assert isinstance(json.loads(r.choices[0].message.content or "")["n"], int)
    assert to_lark('start: "a"\n') == 'start: "a"\n'


async def test_a_failed_load_fails_loudly(
    vllm_model: tuple[art.LocalBackend, art.TrainableModel], tmp_path: Path
) -> None:
    backend, _ = vllm_model
    bad = tmp_path / "not-an-adapter"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{broken")
    with pytest.raises(InfrastructureError, match=r"refused to load adapter|did not take"):
        await backend.engine.load_adapter("v@99", str(bad))
    assert "v@99" not in backend.engine.list_adapters()


async def test_prefix_caching_shows_in_cached_tokens_and_metrics(
    vllm_model: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, _ = vllm_model
    engine: VLLMEngine = backend.engine
    before = engine.metrics()
    one = SamplingParams(max_tokens=1, temperature=0.0)
    prompt = engine.tokenizer(" ".join(f"item{i}" for i in range(150)))["input_ids"]
    assert len(prompt) > 2 * 128  # two of vLLM's CPU KV blocks
    fresh = await engine.generate(prompt, one)
    turn = await engine.generate([*prompt, *prompt[:20]], one)
    streamed = [e async for e in engine.stream([*prompt, *prompt[:30]], one)][-1]
    assert fresh.cached_tokens == 0
    assert turn.cached_tokens >= 256 and isinstance(streamed, GenerateResult)
    assert streamed.cached_tokens >= 256
    after = engine.metrics()
    assert after.prompt_tokens - before.prompt_tokens == 3 * len(prompt) + 50
    assert after.generation_tokens - before.generation_tokens == 3
    assert after.prefix_cache_queries - before.prefix_cache_queries == 3 * len(prompt) + 50
    assert (
        after.prefix_cache_hits - before.prefix_cache_hits
        == turn.cached_tokens + streamed.cached_tokens
    )
    deadline = time.monotonic() + 30  # running/waiting and the capacity come from vLLM
    while engine._counts.vllm_gauges is None and time.monotonic() < deadline:
        engine.metrics()
        await asyncio.sleep(0.2)
    after = engine.metrics()
    assert (after.running, after.waiting) == (0, 0)
    assert after.prefix_cache_capacity_bytes == 2 * 2**30  # kv_cache_gib


async def test_a_crashed_vllm_is_restarted_with_its_adapters(
    vllm_model: tuple[art.LocalBackend, art.TrainableModel],
) -> None:
    backend, model = vllm_model
    engine: VLLMEngine = backend.engine
    assert engine._child.proc is not None
    os.killpg(engine._child.proc.pid, signal.SIGKILL)
    engine._child.proc.wait(timeout=30)
    traj = await _rollout(model, 5)  # restarts vLLM, reloads v@1, answers
    assert traj.calls[0].model == f"v@{await model.get_step()}" and engine.alive()


_STARTER = """
import asyncio, sys
from pathlib import Path
import httpx
from art_langgraph.engine.vllm_config import VLLMEngineConfig
from art_langgraph.engine.vllm_engine import VLLMEngine
from art_langgraph.presets import resolve_preset

config = VLLMEngineConfig(dtype="float32", max_model_len=512, kv_cache_gib=1)
start = (VLLMEngine.start, resolve_preset("smollm2-135m"), config, Path(sys.argv[1]))
engine = asyncio.run(asyncio.to_thread(*start))  # from a worker thread, as LocalBackend does
assert httpx.get(engine._url + "/health").status_code == 200  # that thread's end left it up
print(engine._child.proc.pid, engine._child.scratch, flush=True)
if sys.argv[2] == "sigkill":
    sys.stdin.read()  # until killed
"""


def _processes() -> dict[int, tuple[int, int]]:
    """Live (not zombie) processes: pid -> (parent pid, process group)."""
    out = {}
    for entry in os.listdir("/proc"):
        try:
            fields = (Path("/proc") / entry / "stat").read_text().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and fields[0] not in ("Z", "X"):
            out[int(entry)] = (int(fields[1]), int(fields[2]))
    return out


def _tree(root: int, seen: set[int]) -> set[int]:
    """Live processes among `seen`, in `root`'s process group or descended from `root`."""
    procs = _processes()
    tree = {p for p, (_, group) in procs.items() if group == root} | ({root} & procs.keys())
    for _ in range(8):
        tree |= {p for p, (parent, _) in procs.items() if parent in tree}
    return tree | (seen & procs.keys())


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_vllm_dies_with_the_process_that_started_it(end: str, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(log), end],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    root = 0
    try:
        line = starter.stdout.readline().split()
        assert line and line[0].isdigit(), log.read_text()[-3000:] if log.exists() else "no log"
        root, scratch = int(line[0]), Path(line[1])
        tree = _tree(root, set())
        assert len(tree) >= 3, tree  # the watchdog, vLLM's API server, its engine core
        assert any(scratch.iterdir())  # vLLM's TMPDIR: its dist folder and sockets land there
        if end == "sigkill":
            starter.kill()  # no close(), no atexit, no finally: only the kernel closes its fds
        assert starter.wait(timeout=60) == (-9 if end == "sigkill" else 0)
        deadline = time.monotonic() + 60
        while (left := _tree(root, tree)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"still running after its starter ended: {sorted(left)}"
        assert not scratch.exists()  # and the watchdog deleted what it left in TMPDIR
    finally:
        starter.kill()
        if root:
            for pid in _tree(root, set()):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow_job  # the GRPO step above, from the art-mcp front end
def test_art_mcp_train_with_the_vllm_engine(tmp_path: Path) -> None:
    # fmt: off
    args = [
        "--server", "python -m examples.mcp_server.server",
        "--scenarios", "examples/mcp_server/scenarios.jsonl",
        "--reward", "examples.mcp_server.tasks:score",
        "--path", str(tmp_path), "--name", "mcp-vllm", "--group-size", "2",
        "--groups-per-step", "2", "--sft-epochs", "1", "--max-tokens", "32",
        "--val-fraction", "0.1", "--steps", "1", "--tool-choice", "required",
        "--engine", "vllm", "--base-model", "tiny", "--eval-scenarios", "4",
    ]
    # fmt: on
    out = subprocess.run(
        [sys.executable, "-m", "art_mcp.cli", "train", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RL step 1" in out.stdout
    folder = tmp_path / "mcp" / "models" / "mcp-vllm"
    assert (folder / "logs" / "vllm.log").exists()
    assert [p.name for p in sorted((folder / "checkpoints").iterdir())] == ["0001", "0002"]


@pytest.mark.slow_job  # the GRPO step above, from the LangGraph example
def test_the_langgraph_example_with_the_vllm_engine(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "examples.langgraph_agent", "--steps", "1", "--groups-per-step",
         "2", "--group-size", "2", "--out", str(tmp_path), "--engine", "vllm"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out" in out.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["rows"]) == 1
    assert list((tmp_path / ".art").glob("*/models/*/logs/vllm.log"))
