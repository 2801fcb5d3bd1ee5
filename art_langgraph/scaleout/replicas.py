"""`ReplicaEngine`: the `InferenceEngine` contract over R replicas, each in its own process.

The server and `ChatService` see one engine; behind it:

- **torch replicas** (`ReplicaEngine.start_torch`): each a `TorchEngine` in a child
  process (`scaleout/replica_server.py`) behind our own OpenAI server on a free loopback
  port, with the engine's calls (`/engine/generate`, `/engine/stream`, adapter loads)
  beside `/v1`, so token ids, logprobs and grammars cross exactly. Our server and not
  vLLM's, so the replica is the engine we test everywhere else, on CPUs too.
- **vLLM replicas** (`ReplicaEngine.start_vllm`): R `VLLMEngine`s, each already the
  client of its own managed vLLM server (one GPU each when there are R).

Routing (`scaleout/replica_router.py`): a request that continues a conversation goes to the
replica that served its earlier turn (its prefix cache is warm there); any other goes to
the replica with the fewest requests in flight.

Adapters, all or nothing: `load_adapter` loads into every replica at once; each verifies
it (the child checks its engine lists the adapter, `VLLMEngine` that vLLM lists its
folder). Only when all have it is it listed (`list_adapters`), so the backend serves the
step only then; if one fails, the ones that took it are rolled back (the previous folder
reloaded, or the adapter unloaded) and the error names the replica.

Failures: a supervisor thread checks every `check_interval_s` that each replica's process
lives; a dead one is taken out of routing, forgotten by the router, restarted and given
the adapters it held, then routed to again. A request whose replica dies under it
(connection refused or broken) is retried once on another replica; a stream only if no
token was sent yet (resuming mid-stream would need the grammar's and stop strings'
state). Children never outlive this process: each holds the read end of a pipe only we
write, and exits on EOF (a vLLM server runs under `watchdog.py` for the same).

- **Ray replicas** (`ReplicaEngine.start_ray`): the torch replica as a Ray actor on any
  node of a cluster (`scaleout/ray_replica.py`), restarted by Ray when it dies.

Left out: vLLM replicas on Ray, replicas of different sizes, and moving a conversation
off an overloaded replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from art_langgraph.engine.base import (
    EngineMetrics,
    EngineTraits,
    GenerateResult,
    SamplingParams,
    TokenEvent,
)
from art_langgraph.errors import InfrastructureError, UsageError
from art_langgraph.runtime.event_loops import PerLoop
from art_langgraph.scaleout.replica_clients import (
    Replica,
    ReplicaUnreachable,
    TorchReplica,
    VLLMReplica,
)
from art_langgraph.scaleout.replica_router import ReplicaRouter

log = logging.getLogger(__name__)


class ReplicaEngine:
    """An `InferenceEngine` over R replicas (see the module docstring). Build it with
    `start_torch` or `start_vllm`."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        tokenizer: Any,
        context_length: int,
        vocab_size: int,
        *,
        check_interval_s: float = 0.5,
        startup_timeout_s: float = 300.0,
    ) -> None:
        """`check_interval_s`: how often the supervisor checks the replicas' processes.
        `startup_timeout_s`: how long an adapter load waits for a restarting replica."""
        from art_langgraph.engine.constrained import GrammarCompiler

        if not replicas:
            raise UsageError("a ReplicaEngine needs at least one replica")
        self.replicas = list(replicas)
        self.tokenizer = tokenizer
        self.context_length = int(context_length)
        self.vocab_size = int(vocab_size)
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size)
        self.router = ReplicaRouter(len(self.replicas))
        self.restarts = [0] * len(self.replicas)
        """How many times each replica was restarted (for tests and logs)."""
        self.retries = 0
        """Requests retried on another replica after theirs died."""
        self._up = set(range(len(self.replicas)))
        self._restarting: set[int] = set()
        self._route_lock = threading.Lock()  # the router, shared with the supervisor thread
        self._adapters: dict[str, str] = {}
        self._adapter_lock: PerLoop[asyncio.Lock] = PerLoop(asyncio.Lock)
        self.startup_timeout_s = startup_timeout_s
        self._closing = threading.Event()
        self._supervisor = threading.Thread(
            target=self._supervise, args=(check_interval_s,), name="art-replicas", daemon=True
        )
        self._supervisor.start()

    # --------------------------------------------------------------- build
    @classmethod
    def start(
        cls,
        kind: str,
        base_path: str,
        replicas: int,
        config: Any = None,
        log_dir: Path | None = None,
        *,
        device: str | None = None,
        lora_rank: int = 8,
    ) -> ReplicaEngine:
        """`kind` "torch" (`start_torch`; `device` when `config` is None) or "vllm"
        (`start_vllm`; `lora_rank` sizes vLLM's --max-lora-rank)."""
        if kind == "vllm":
            return cls.start_vllm(base_path, replicas, config, log_dir, lora_rank)
        if kind != "torch":
            raise UsageError(f"replicas run the torch or the vllm engine, not {kind!r}")
        if config is None and device is not None:
            from art_langgraph.engine.torch_engine import TorchEngineConfig

            config = TorchEngineConfig(device=device)
        return cls.start_torch(base_path, replicas, config, log_dir)

    @classmethod
    def start_torch(
        cls,
        base_path: str,
        replicas: int,
        config: Any = None,
        log_dir: Path | None = None,
        *,
        threads: int | None = None,
        startup_timeout_s: float = 300.0,
        check_interval_s: float = 0.5,
    ) -> ReplicaEngine:
        """R `TorchEngine`s in child processes. `config`: a `TorchEngineConfig` for each (its
        `device` None: replica i on CUDA device i mod the count when there is CUDA, else the
        CPU). `threads`: torch threads per replica; None: the CPU cores / R (at least 1)."""
        from art_langgraph.engine.torch_engine import TorchEngineConfig

        _check_count(replicas)
        config = config or TorchEngineConfig()
        log_dir = log_dir or Path(".art") / "logs"
        threads = threads or max(1, (os.cpu_count() or 1) // replicas)
        gpus = _cuda_count() if config.device is None else 0
        members = [
            TorchReplica(
                i,
                base_path,
                dataclasses.replace(config, device=f"cuda:{i % gpus}") if gpus else config,
                threads,
                log_dir / f"replica{i}.log",
                startup_timeout_s,
            )
            for i in range(replicas)
        ]
        _start_all([m.spawn for m in members], members)
        return cls._over_torch(members, base_path, config, check_interval_s, startup_timeout_s)

    @classmethod
    def start_ray(
        cls,
        ray: Any,
        base_path: str,
        replicas: int,
        config: Any = None,
        share: Any = None,
        *,
        startup_timeout_s: float = 300.0,
        check_interval_s: float = 0.5,
    ) -> ReplicaEngine:
        """R `TorchEngine`s as Ray actors (`scaleout/ray_replica.py`), each asking the cluster
        for `share` (a `ray_cluster.ActorShare`; None: `shares(ray, replicas, 0)`); Ray
        restarts one that dies. `ray`: the connected module (`ray_cluster.connect`)."""
        from art_langgraph.engine.torch_engine import TorchEngineConfig
        from art_langgraph.scaleout.ray_cluster import shares
        from art_langgraph.scaleout.ray_replica import RayReplica

        _check_count(replicas)
        config = config or TorchEngineConfig()
        share = share or shares(ray, replicas, 0)
        members = [
            RayReplica(i, ray, base_path, config, share, startup_timeout_s) for i in range(replicas)
        ]
        _start_all([m.spawn for m in members], members)
        return cls._over_torch(members, base_path, config, check_interval_s, startup_timeout_s)

    @classmethod
    def _over_torch(
        cls,
        members: Sequence[Any],
        base_path: str,
        config: Any,
        check_interval_s: float,
        startup_timeout_s: float,
    ) -> ReplicaEngine:
        """The engine over started torch replicas, with the tokenizer they use."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(base_path)
        if config.chat_template is not None:
            from art_langgraph.chat.templates import load_chat_template

            tokenizer.chat_template = load_chat_template(config.chat_template)
        info = members[0].info
        return cls(
            members,
            tokenizer,
            info["context_length"],
            info["vocab_size"],
            check_interval_s=check_interval_s,
            startup_timeout_s=startup_timeout_s,
        )

    @classmethod
    def start_vllm(
        cls,
        base_path: str,
        replicas: int,
        config: Any = None,
        log_dir: Path | None = None,
        lora_rank: int = 8,
    ) -> ReplicaEngine:
        """R managed vLLM servers (`VLLMEngine`); with R or more GPUs, replica i sees only
        GPU i (CUDA_VISIBLE_DEVICES). Tested with vLLM's CPU build
        (tests/scaleout/test_vllm_replicas.py); on GPUs untested (none was lent)."""
        from art_langgraph.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

        _check_count(replicas)
        config = config or VLLMEngineConfig()
        log_dir = log_dir or Path(".art") / "logs"
        gpus = _cuda_count()
        engines: list[Any] = [None] * replicas

        def start(i: int) -> None:
            cfg = config
            if gpus >= replicas:
                cfg = dataclasses.replace(
                    config, extra_env={**config.extra_env, "CUDA_VISIBLE_DEVICES": str(i)}
                )
            engines[i] = VLLMEngine.start(base_path, cfg, log_dir / f"vllm{i}.log", lora_rank)

        members: list[VLLMReplica] = []
        try:
            with ThreadPoolExecutor(replicas) as pool:
                list(pool.map(start, range(replicas)))
        except BaseException:
            for e in engines:
                if e is not None:
                    e.close_sync()
            raise
        members = [VLLMReplica(i, e) for i, e in enumerate(engines)]
        first = engines[0]
        engine = cls(
            members,
            first.tokenizer,
            first.context_length,
            first.vocab_size,
            startup_timeout_s=config.startup_timeout_s,
        )
        engine.max_lora_rank = first.max_lora_rank
        return engine

    max_lora_rank: int | None = None
    """The largest LoRA rank the replicas accept (vLLM's; None: any)."""

    # ---------------------------------------------------------- supervisor
    def _supervise(self, interval: float) -> None:
        """Restart dead replicas, one at a time, until closed."""
        while not self._closing.wait(interval):
            for i, member in enumerate(self.replicas):
                if self._closing.is_set() or member.alive():
                    continue
                self._restarting.add(i)
                self._up.discard(i)
                with self._route_lock:
                    self.router.forget(i)
                log.warning("%s is gone; restarting it", member.label)
                try:
                    member.restart_sync()
                except Exception as exc:  # retried at the next check
                    log.error("could not restart %s: %s", member.label, exc)
                    continue
                if self._closing.is_set():
                    return
                self.restarts[i] += 1
                self._up.add(i)
                self._restarting.discard(i)
                log.warning("%s is back, with adapters %s", member.label, sorted(member.adapters))

    def up(self) -> list[int]:
        """The replicas serving now (the others are restarting)."""
        return sorted(self._up)

    async def _wait_up(self, i: int) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while i not in self._up:
            if time.monotonic() > deadline or self._closing.is_set():
                raise InfrastructureError(f"{self.replicas[i].label} is down and did not come back")
            await asyncio.sleep(0.05)

    async def _any_up(self, exclude: set[int]) -> list[int]:
        deadline = time.monotonic() + self.startup_timeout_s
        while not (ready := [i for i in list(self._up) if i not in exclude]):
            if time.monotonic() > deadline or self._closing.is_set():
                raise InfrastructureError("no inference replica is up")
            await asyncio.sleep(0.05)
        return ready

    # ------------------------------------------------------------ requests
    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> GenerateResult:
        if adapter is not None and adapter not in self._adapters:
            raise UsageError(f"adapter {adapter!r} is not loaded")
        failed: set[int] = set()
        while True:
            i = self._choose(prompt_ids, adapter, await self._any_up(failed))
            self.router.in_flight[i] += 1
            try:
                result = await self.replicas[i].generate(prompt_ids, sampling, adapter)
            except ReplicaUnreachable as exc:
                if failed:
                    raise
                failed.add(i)
                self._up.discard(i)  # the supervisor restarts it if its process is gone
                self._recheck(i)
                self.retries += 1
                log.warning("%s; retrying the request on another replica", exc)
                continue
            finally:
                self.router.in_flight[i] -= 1
            self._record(i, prompt_ids, result.completion_token_ids, adapter)
            return result

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[TokenEvent | GenerateResult]:
        if adapter is not None and adapter not in self._adapters:
            raise UsageError(f"adapter {adapter!r} is not loaded")
        failed: set[int] = set()
        while True:
            i = self._choose(prompt_ids, adapter, await self._any_up(failed))
            self.router.in_flight[i] += 1
            sent = False
            try:
                async for item in self.replicas[i].stream(prompt_ids, sampling, adapter):
                    if isinstance(item, GenerateResult):
                        self._record(i, prompt_ids, item.completion_token_ids, adapter)
                    sent = True
                    yield item
                return
            except ReplicaUnreachable as exc:
                if failed or sent:
                    raise
                failed.add(i)
                self._up.discard(i)
                self._recheck(i)
                self.retries += 1
                log.warning("%s; retrying the stream on another replica", exc)
            finally:
                self.router.in_flight[i] -= 1

    def _choose(self, prompt_ids: Sequence[int], adapter: str | None, up: list[int]) -> int:
        with self._route_lock:
            return self.router.choose(prompt_ids, adapter, up)

    def _record(
        self, i: int, prompt_ids: Sequence[int], completion: Sequence[int], adapter: str | None
    ) -> None:
        with self._route_lock:
            self.router.record(i, prompt_ids, completion, adapter)

    def _recheck(self, i: int) -> None:
        """A replica that failed a request but whose process lives goes back into routing
        after a second (it may have been a broken connection); a dead one stays out until
        the supervisor has restarted it."""

        def later() -> None:
            if self._closing.wait(1.0) or i in self._restarting:
                return
            if self.replicas[i].alive():
                self._up.add(i)

        threading.Thread(target=later, daemon=True).start()

    # ------------------------------------------------------------ adapters
    async def load_adapter(self, name: str, path: str) -> None:
        """Load `name` into every replica, or into none (see the module docstring)."""
        async with self._adapter_lock.get():
            previous = self._adapters.get(name)

            async def one(i: int) -> None:
                await self._wait_up(i)
                await self.replicas[i].load_adapter(name, path)

            outcomes = await asyncio.gather(
                *(one(i) for i in range(len(self.replicas))), return_exceptions=True
            )
            failed = [(i, e) for i, e in enumerate(outcomes) if isinstance(e, BaseException)]
            if not failed:
                self._adapters[name] = path
                return
            for i, outcome in enumerate(outcomes):
                if isinstance(outcome, BaseException):
                    continue
                try:  # roll back: the replicas that took it serve what they served before
                    if previous is not None:
                        await self.replicas[i].load_adapter(name, previous)
                    else:
                        await self.replicas[i].unload_adapter(name)
                except Exception as exc:
                    log.error("could not roll %s back on %s: %s", name, self.replicas[i].label, exc)
            if previous is None:
                self._adapters.pop(name, None)
            i, error = failed[0]
            others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            message = (
                f"adapter {name!r} from {path} is served by no replica: "
                f"{self.replicas[i].label} failed to load it{others}: {error}"
            )
            if isinstance(error, UsageError):
                raise UsageError(message) from error
            raise InfrastructureError(message) from error

    async def unload_adapter(self, name: str) -> None:
        async with self._adapter_lock.get():
            self._adapters.pop(name, None)
            for i, member in enumerate(self.replicas):
                if i not in self._up:
                    member.adapters.pop(name, None)  # not reloaded when it comes back
                    continue
                try:
                    await member.unload_adapter(name)
                except Exception as exc:
                    log.warning("could not unload %s from %s: %s", name, member.label, exc)

    def list_adapters(self) -> list[str]:
        return sorted(self._adapters)

    @property
    def traits(self) -> EngineTraits:
        """The replicas' largest LoRA rank (vLLM's; None: any). Their weights live in their
        own processes, so a trainer loads its own copy in its own dtype rule."""
        return EngineTraits(max_lora_rank=self.max_lora_rank)

    async def reset_prefix_cache(self) -> None:
        """Nothing: each replica's prefix cache is keyed by the adapter its KV was computed
        under, and its memory is its own process's, not the trainer's."""

    # ------------------------------------------------------------- metrics
    def metrics(self) -> EngineMetrics:
        """Sums over the replicas (each a reading at most a second old)."""
        total = EngineMetrics()
        for m in self.replicas:
            part = m.metrics()
            for f in dataclasses.fields(EngineMetrics):
                setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))
        return total

    # --------------------------------------------------------------- close
    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        self._closing.set()
        self._supervisor.join(60)
        with ThreadPoolExecutor(len(self.replicas)) as pool:
            list(pool.map(lambda m: m.stop(), self.replicas))


def _check_count(replicas: int) -> None:
    if not isinstance(replicas, int) or replicas < 1:
        raise UsageError(f"replicas must be an integer >= 1, got {replicas!r}")


def _start_all(starts: list[Any], members: Sequence[Any]) -> None:
    """Run the start functions in parallel; if one fails, stop all and raise its error."""
    try:
        with ThreadPoolExecutor(len(starts)) as pool:
            list(pool.map(lambda f: f(), starts))
    except BaseException:
        for m in members:
            m.stop()
        raise


def _cuda_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except ImportError:
        return 0
