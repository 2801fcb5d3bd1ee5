"""Two managed vLLM servers (vLLM's CPU build) as the replicas of one backend.

`LocalBackend(engine="vllm", replicas=2)` on the real preset (fp32): a step's adapter is
verified by both servers before it is served, requests spread over both, and a vLLM killed
with its whole process group is restarted by the replicas' supervisor with the adapter.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

import art_langgraph as art
from art_langgraph.engine.base import SamplingParams
from art_langgraph.engine.vllm_config import VLLMEngineConfig
from art_langgraph.scaleout.replica_clients import VLLMReplica
from art_langgraph.scaleout.replicas import ReplicaEngine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


async def test_two_vllm_replicas_serve_each_step_and_a_killed_one_comes_back(
    tmp_path: Path,
) -> None:
    config = VLLMEngineConfig(dtype="float32", max_model_len=512, kv_cache_gib=1)
    async with art.LocalBackend(
        tmp_path, engine=art.EngineChoice("vllm", config=config), replicas=2
    ) as backend:
        model = art.TrainableModel(name="v", project="p", base_model="smollm2-135m")
        await model.register(backend)
        engine = backend.engine
        assert isinstance(engine, ReplicaEngine)
        assert all(isinstance(m, VLLMReplica) for m in engine.replicas)

        convo = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one"}]
        result = await model.train_sft([convo], art.TrainConfig(learning_rate=1e-3), epochs=1)
        assert result.step == 1
        assert all("v@1" in m.adapters for m in engine.replicas)  # verified by each server
        client = model.openai_client(max_retries=0)
        answers = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="v", messages=[{"role": "user", "content": f"hi {k}"}], max_tokens=2
                )
                for k in range(4)
            )
        )
        assert {a.model for a in answers} == {"v@1"}
        assert min(engine.router.given) >= 1  # both servers answered

        victim = engine.replicas[0]
        assert isinstance(victim, VLLMReplica) and victim.engine._child.proc is not None
        os.killpg(victim.engine._child.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 300
        while not (engine.restarts[0] and 0 in engine.up()):
            assert time.monotonic() < deadline, "the vLLM replica did not come back"
            await asyncio.sleep(0.2)
        prompt = engine.tokenizer.encode("count to three")
        again = await victim.generate(prompt, SamplingParams(max_tokens=3), "v@1")
        assert len(again.completion_token_ids) == 3  # it serves the step's adapter again
