"""`ReplicaEngine`: routing, all-or-nothing adapter loads, retries and restarts.

The fast tests run the router and the engine over in-process fake replicas; the slow ones
run two tiny `TorchEngine` replicas in child processes behind the real server, spoken to
with the real `openai` client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from art_langgraph.engine.base import EngineMetrics, GenerateResult, SamplingParams, TokenEvent
from art_langgraph.errors import InfrastructureError, UsageError
from art_langgraph.scaleout.replica_clients import ReplicaUnreachable
from art_langgraph.scaleout.replica_router import ReplicaRouter
from art_langgraph.scaleout.replicas import ReplicaEngine
from art_langgraph.serving import ModelRegistry, ServerHandle, start_server

# ------------------------------------------------------------------ router


def test_router_keeps_a_conversation_and_spreads_new_ones() -> None:
    router = ReplicaRouter(2)
    prompt = list(range(100, 140))
    # three rollouts of one group: the same first prompt, spread by load
    first = [router.choose(prompt, "m@1", {0, 1}) for _ in range(3)]
    assert first == [0, 1, 0]  # ties: the replica given fewer requests
    replies = {0: [5, 6, 7], 1: [8, 9, 10], 2: [11, 12, 13]}
    for k, replica in enumerate(first):
        router.record(replica, prompt, replies[k], "m@1")
    # their second turns: the prompt, the reply, then a tool result
    for k, replica in enumerate(first):
        turn2 = [*prompt, *replies[k], 1, 2, 3]
        assert router.follow(turn2, "m@1") == replica
        assert router.choose(turn2, "m@1", {0, 1}) == replica
    # a reply re-tokenized differently after its first tokens still matches those
    assert router.follow([*prompt, 5, 6, 99, 1], "m@1") == 0
    # another step's adapter, a replica that is down, a forgotten replica: balance again
    assert router.follow([*prompt, 8, 9, 10], "m@2") is None
    router.in_flight[1] = 3
    assert router.choose([*prompt, 8, 9, 10], "m@1", {0}) == 0
    router.forget(1)
    assert router.follow([*prompt, 8, 9, 10], "m@1") is None


def test_router_key_table_is_bounded() -> None:
    router = ReplicaRouter(2, follow_tokens=4, max_keys=8)
    for k in range(10):
        router.record(k % 2, [k, k, k], [1, 2, 3, 4], None)
    assert len(router._keys) == 8 and sum(router._lengths.values()) == 8
    assert router.follow([9, 9, 9, 1, 2], None) == 1  # the newest survive
    assert router.follow([0, 0, 0, 1, 2], None) is None


# -------------------------------------------------------- fake replicas


class FakeReplica:
    """An in-process replica: answers with its index as the one completion token."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.adapters: dict[str, str] = {}
        self.dead = False
        """Its process is gone (the supervisor sees it)."""
        self.unreachable = False
        """Its requests fail as if the connection broke."""
        self.fail_load: Exception | None = None
        self.served = 0

    @property
    def label(self) -> str:
        return f"replica {self.index} (fake)"

    def alive(self) -> bool:
        return not self.dead

    def restart_sync(self) -> None:
        self.dead = self.unreachable = False

    def stop(self) -> None:
        self.dead = True

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(generation_tokens=self.served)

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None
    ) -> GenerateResult:
        if self.dead or self.unreachable:
            raise ReplicaUnreachable(f"{self.label} did not answer")
        if adapter is not None and adapter not in self.adapters:
            raise UsageError(f"adapter {adapter!r} is not loaded")
        self.served += 1
        return GenerateResult(list(prompt_ids), [self.index], [0.0], "stop", adapter=adapter)

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None
    ) -> AsyncIterator[TokenEvent | GenerateResult]:
        result = await self.generate(prompt_ids, sampling, adapter)
        yield TokenEvent(self.index, 0.0)
        yield result

    async def load_adapter(self, name: str, path: str) -> None:
        if self.fail_load is not None:
            raise self.fail_load
        self.adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)


@pytest.fixture
def fakes(tiny_path: Path) -> Iterator[tuple[ReplicaEngine, list[FakeReplica]]]:
    from transformers import AutoTokenizer

    replicas = [FakeReplica(0), FakeReplica(1)]
    tok = AutoTokenizer.from_pretrained(tiny_path)
    engine = ReplicaEngine(
        replicas, tok, 256, len(tok), check_interval_s=0.05, startup_timeout_s=1.0
    )
    yield engine, replicas
    engine.close_sync()


async def test_adapter_load_is_all_or_nothing(
    fakes: tuple[ReplicaEngine, list[FakeReplica]],
) -> None:
    engine, replicas = fakes
    await engine.load_adapter("m@1", "/ckpt/1")
    assert engine.list_adapters() == ["m@1"]
    assert all(r.adapters == {"m@1": "/ckpt/1"} for r in replicas)

    replicas[1].fail_load = InfrastructureError("disk on fire")
    with pytest.raises(InfrastructureError, match=r"replica 1 \(fake\) failed.*disk on fire"):
        await engine.load_adapter("m@2", "/ckpt/2")
    assert engine.list_adapters() == ["m@1"]  # the step is served nowhere
    assert replicas[0].adapters == {"m@1": "/ckpt/1"}  # rolled back

    with pytest.raises(InfrastructureError, match="replica 1"):  # a replacement: the old stays
        await engine.load_adapter("m@1", "/ckpt/1b")
    assert replicas[0].adapters == {"m@1": "/ckpt/1"}

    replicas[1].fail_load = UsageError("not a peft folder")  # the caller's kind of error
    with pytest.raises(UsageError, match="replica 1"):
        await engine.load_adapter("m@3", "/nope")

    replicas[1].fail_load = None
    await engine.unload_adapter("m@1")
    assert engine.list_adapters() == [] and all(r.adapters == {} for r in replicas)


async def test_request_on_a_dead_replica_is_retried_once_elsewhere(
    fakes: tuple[ReplicaEngine, list[FakeReplica]],
) -> None:
    engine, replicas = fakes
    s = SamplingParams(max_tokens=1)
    first = await engine.generate([1, 2, 3], s)
    home = replicas[first.completion_token_ids[0]]
    home.unreachable = True  # its connection breaks mid-request
    # the same conversation's next turn sticks to it, fails, and is retried on the other
    nxt = await engine.generate([1, 2, 3, *first.completion_token_ids, 4], s)
    assert nxt.completion_token_ids != first.completion_token_ids
    assert engine.retries == 1
    home.dead = True  # its process is gone: the supervisor restarts it
    deadline = time.monotonic() + 5
    while (engine.up() != [0, 1] or not sum(engine.restarts)) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert engine.up() == [0, 1] and sum(engine.restarts) == 1
    # with both dead, one retry, then the error
    for r in replicas:
        r.dead = True
        r.restart_sync = lambda: None  # type: ignore[method-assign]  # they stay dead
    with pytest.raises(InfrastructureError):
        await asyncio.wait_for(engine.generate([7], s), 5)


async def test_stream_is_retried_before_its_first_token(
    fakes: tuple[ReplicaEngine, list[FakeReplica]],
) -> None:
    engine, replicas = fakes
    replicas[0].unreachable = True
    items = [item async for item in engine.stream([1, 2], SamplingParams(max_tokens=1))]
    assert isinstance(items[-1], GenerateResult) and items[-1].completion_token_ids == [1]
    assert engine.retries == 1


# ------------------------------------------------- real child processes


@pytest.fixture(scope="module")
def replicas(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaEngine]:
    engine = ReplicaEngine.start_torch(
        str(tiny_path), 2, log_dir=tmp_path_factory.mktemp("replicas"), threads=1
    )
    yield engine
    engine.close_sync()


@pytest.fixture(scope="module")
def replica_server(replicas: ReplicaEngine) -> Iterator[tuple[ServerHandle, ModelRegistry]]:
    registry = ModelRegistry("tiny")
    with start_server(replicas, registry) as handle:
        yield handle, registry


def _client(handle: ServerHandle) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=handle.base_url, api_key="none", max_retries=0)


def _served_by(engine: ReplicaEngine, before: list[int]) -> int:
    changed = [
        i for i, (a, b) in enumerate(zip(before, engine.router.given, strict=True)) if a != b
    ]
    assert len(changed) == 1
    return changed[0]


@pytest.mark.slow
async def test_rollout_turns_stay_on_one_replica(
    replicas: ReplicaEngine, replica_server: tuple[ServerHandle, ModelRegistry]
) -> None:
    client = _client(replica_server[0])
    chats: list[list[dict[str, str]]] = [
        [{"role": "user", "content": f"question number {k}: what is {k} plus {k}?"}]
        for k in range(3)
    ]
    homes: dict[int, int] = {}
    for turn in range(3):
        for k, chat in enumerate(chats):
            before = list(replicas.router.given)
            r = await client.chat.completions.create(
                model="tiny", messages=chat, max_tokens=6, temperature=0
            )
            where = _served_by(replicas, before)
            if turn == 0:
                homes[k] = where
            else:
                assert where == homes[k], f"rollout {k}, turn {turn}"
                assert r.usage.prompt_tokens_details.cached_tokens > 0  # its KV was there
            chat += [
                {"role": "assistant", "content": r.choices[0].message.content or ""},
                {"role": "user", "content": f"and turn {turn + 1}?"},
            ]
    assert set(homes.values()) == {0, 1}  # new rollouts were spread


@pytest.mark.slow
async def test_adapter_reaches_every_replica_before_the_step_is_served(
    replicas: ReplicaEngine,
    replica_server: tuple[ServerHandle, ModelRegistry],
    lora_adapter: Path,
) -> None:
    handle, registry = replica_server
    registry.add_model("agent")
    await replicas.load_adapter("agent@1", str(lora_adapter))
    for member in replicas.replicas:  # each child's own server lists it
        health = httpx.get(member.url + "/health", timeout=10).json()  # type: ignore[attr-defined]
        assert "agent@1" in health["adapters"]
    registry.set_step("agent", 1, "agent@1", str(lora_adapter))
    client = _client(handle)
    for k in range(4):  # spread over both replicas
        r = await client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": f"hi {k}"}], max_tokens=3
        )
        assert r.model == "agent@1"
    # a folder that does not load is served nowhere, and the error names a replica
    with pytest.raises(UsageError, match=r"replica \d"):
        await replicas.load_adapter("agent@2", str(lora_adapter.parent / "missing"))
    assert "agent@2" not in replicas.list_adapters()


@pytest.mark.slow
async def test_killed_replica_request_is_retried_and_the_replica_comes_back(
    replicas: ReplicaEngine,
    replica_server: tuple[ServerHandle, ModelRegistry],
    lora_adapter: Path,
) -> None:
    handle, registry = replica_server
    if "agent@1" not in replicas.list_adapters():
        registry.add_model("agent")
        await replicas.load_adapter("agent@1", str(lora_adapter))
        registry.set_step("agent", 1, "agent@1", str(lora_adapter))
    client = _client(handle)
    retries, restarts = replicas.retries, list(replicas.restarts)
    call = asyncio.ensure_future(
        client.chat.completions.create(
            model="agent",
            messages=[{"role": "user", "content": "a long answer, please"}],
            max_tokens=1500,
            extra_body={"ignore_eos": True},
        )
    )
    deadline = time.monotonic() + 30
    while sum(replicas.router.in_flight) == 0:
        assert time.monotonic() < deadline and not call.done()
        await asyncio.sleep(0.005)
    victim = replicas.router.in_flight.index(1)
    pid = replicas.replicas[victim].pid  # type: ignore[attr-defined]
    os.kill(pid, signal.SIGKILL)
    r = await asyncio.wait_for(call, 120)
    assert r.model == "agent@1" and r.usage.completion_tokens == 1500
    assert replicas.retries == retries + 1
    deadline = time.monotonic() + 120
    while replicas.restarts[victim] == restarts[victim] or victim not in replicas.up():
        assert time.monotonic() < deadline, "the replica did not come back"
        await asyncio.sleep(0.1)
    member = replicas.replicas[victim]
    assert member.pid != pid  # type: ignore[attr-defined]
    health = httpx.get(member.url + "/health", timeout=10).json()  # type: ignore[attr-defined]
    assert "agent@1" in health["adapters"]  # reloaded with the current adapter


@pytest.mark.slow
async def test_local_backend_with_two_replicas_serves_each_step_from_both(
    tmp_path: Path,
) -> None:
    from openai import AsyncOpenAI

    import art_langgraph as art

    async with art.LocalBackend(path=tmp_path, replicas=2, engine="torch") as backend:
        model = art.TrainableModel(name="rep", project="p", base_model="tiny")
        await model.register(backend)
        assert isinstance(backend.engine, ReplicaEngine)
        convo = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one"}]
        result = await model.train_sft([convo], art.TrainConfig(learning_rate=1e-3), epochs=1)
        assert result.step == 1
        for member in backend.engine.replicas:
            health = httpx.get(member.url + "/health", timeout=10).json()  # type: ignore[attr-defined]
            assert "rep@1" in health["adapters"]
        client = AsyncOpenAI(base_url=model.inference_base_url, api_key="x", max_retries=0)
        answers = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="rep", messages=[{"role": "user", "content": f"hi {k}"}], max_tokens=2
                )
                for k in range(4)
            )
        )
        assert {a.model for a in answers} == {"rep@1"}
        assert min(backend.engine.router.given) >= 1  # both replicas served


_ORPHAN = """
import sys, time
from pathlib import Path
from art_langgraph.scaleout.replicas import ReplicaEngine
engine = ReplicaEngine.start_torch(sys.argv[1], 1, log_dir=Path(sys.argv[2]), threads=1)
print(engine.replicas[0].pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_children_die_with_their_parent(tiny_path: Path, tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, str(tiny_path), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # it runs
        parent.kill()  # SIGKILL: no cleanup of any kind
        parent.wait(10)
        deadline = time.monotonic() + 15
        while _running(child):
            assert time.monotonic() < deadline, "the replica outlived its parent"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            parent.kill()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in "ZX"
    except OSError:
        return False
