"""One replica as `ReplicaEngine` sees it: the parent's side of a child process.

`TorchReplica` starts a `TorchEngine` in a child (`scaleout/replica_server.py`), waits for
its ready file, and speaks to it over HTTP (`/engine/...`); `VLLMReplica` wraps a
`VLLMEngine`, already the client of its own managed vLLM server. Both say whether their
process lives (`alive`), restart it with the adapters it held (`restart_sync`), and raise
`ReplicaUnreachable` when the process did not answer, so the engine retries elsewhere.

Left out: routing, all-or-nothing loads and supervision (`scaleout/replicas.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from art_langgraph.engine.base import EngineMetrics, GenerateResult, SamplingParams, TokenEvent
from art_langgraph.errors import InfrastructureError
from art_langgraph.runtime.event_loops import PerLoop
from art_langgraph.runtime.watchdog import WatchedProcess
from art_langgraph.scaleout.replica_server import (
    event_from_wire,
    raise_wire_error,
    result_from_wire,
    sampling_to_wire,
)

log = logging.getLogger(__name__)

_COUNTERS = (
    "prompt_tokens",
    "generation_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prefix_cache_evictions",
)


class ReplicaUnreachable(InfrastructureError):
    """A replica's process did not answer (dead, or the connection broke): retry elsewhere."""


class Replica(Protocol):
    """What the `ReplicaEngine` needs of one replica."""

    adapters: dict[str, str]
    """Adapters this replica holds (name -> folder); reloaded after a restart."""

    @property
    def label(self) -> str: ...
    def alive(self) -> bool: ...
    def restart_sync(self) -> None: ...
    def stop(self) -> None: ...
    def metrics(self) -> EngineMetrics: ...
    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None
    ) -> GenerateResult: ...
    def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None
    ) -> AsyncIterator[TokenEvent | GenerateResult]: ...
    async def load_adapter(self, name: str, path: str) -> None: ...
    async def unload_adapter(self, name: str) -> None: ...


# ---------------------------------------------------------------- torch child
class TorchReplica:
    """A `TorchEngine` in a child process (`replica_server.py`), spoken to over HTTP."""

    def __init__(
        self,
        index: int,
        base_path: str,
        config: Any,
        threads: int,
        log_path: Path,
        startup_timeout_s: float,
    ) -> None:
        self.index, self.base_path, self.config = index, base_path, config
        self.threads, self.log_path, self.startup_timeout_s = threads, log_path, startup_timeout_s
        self.adapters: dict[str, str] = {}
        self.info: dict[str, Any] = {}
        """What the child reported when ready: port, pid, context_length, vocab_size."""
        self.url = ""
        self.headers: dict[str, str] = {}
        """Sent with every request (a Ray replica's API key)."""
        self._child = WatchedProcess(f"replica {index}", self.log_path)
        self._clients: PerLoop[httpx.AsyncClient] = PerLoop(
            lambda: httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=10.0), headers=self.headers
            )
        )
        self._lock = threading.Lock()
        self._last = EngineMetrics()  # the child's last reading
        self._carried = EngineMetrics()  # counters of its earlier lives
        self._read_at = -1e9
        self._reading = False

    @property
    def label(self) -> str:
        return (
            f"replica {self.index} (pid {self.info.get('pid', '?')}, {self.url or 'not started'})"
        )

    @property
    def pid(self) -> int | None:
        """The child's process id (None before it started)."""
        return self._child.pid

    # ------------------------------------------------------------- process
    def spawn(self) -> None:
        """Start the child and wait until it serves (its ready file appears)."""
        ready = self.log_path.with_name(f"replica{self.index}.ready")
        ready.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "art_langgraph.scaleout.replica_server",
            "--base", self.base_path, "--ready", str(ready),
            "--config", json.dumps(dataclasses.asdict(self.config)),
            "--threads", str(self.threads), "--name", "base",
        ]  # fmt: skip
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH", "")) if p
        )}  # fmt: skip
        self._child.start(
            lambda fd: [*cmd, "--watch", str(fd)],
            env,
            f"replica {self.index}",
            ready=ready.exists,
            timeout_s=self.startup_timeout_s,
        )
        self.info = json.loads(ready.read_text())
        self.url = f"http://127.0.0.1:{self.info['port']}"
        log.info("%s serves %s", self.label, self.base_path)

    def alive(self) -> bool:
        return self._child.alive()

    def stop(self) -> None:
        self._child.stop(grace_s=10)

    def restart_sync(self) -> None:
        """Start the child again and reload the adapters it held (blocking)."""
        self._carry_counters()
        self.stop()
        self.spawn()
        self._reload_adapters()

    def _carry_counters(self) -> None:
        """Keep the counters of the life that ended (a new one starts from zero)."""
        with self._lock:
            for name in _COUNTERS:
                total = getattr(self._carried, name) + getattr(self._last, name)
                setattr(self._carried, name, total)
            self._last = EngineMetrics()

    def _reload_adapters(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(None, connect=10.0), headers=self.headers) as http:
            for name, path in list(self.adapters.items()):
                r = http.post(self.url + "/engine/load_adapter", json={"name": name, "path": path})
                if r.status_code != 200:
                    raise_wire_error(_json(r), self.label)

    # ------------------------------------------------------------ requests
    async def _post(self, route: str, body: dict[str, Any]) -> Any:
        try:
            r = await self._clients.get().post(self.url + route, json=body)
        except httpx.TransportError as exc:
            raise ReplicaUnreachable(f"{self.label} did not answer {route}: {exc!r}") from None
        data = _json(r)
        if r.status_code != 200:
            raise_wire_error(data, self.label)
        return data

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None
    ) -> GenerateResult:
        body = {"prompt_ids": list(prompt_ids), "sampling": sampling_to_wire(sampling)}
        return result_from_wire(await self._post("/engine/generate", {**body, "adapter": adapter}))

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None
    ) -> AsyncIterator[TokenEvent | GenerateResult]:
        body = {
            "prompt_ids": list(prompt_ids),
            "sampling": sampling_to_wire(sampling),
            "adapter": adapter,
        }
        try:
            async with self._clients.get().stream(
                "POST", self.url + "/engine/stream", json=body
            ) as r:
                if r.status_code != 200:
                    raise_wire_error(
                        _json(httpx.Response(r.status_code, content=await r.aread())), self.label
                    )
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    item = json.loads(line)
                    if "token" in item:
                        yield event_from_wire(item["token"])
                    elif "result" in item:
                        yield result_from_wire(item["result"])
                        return
                    else:
                        raise_wire_error(item, self.label)
        except httpx.TransportError as exc:
            raise ReplicaUnreachable(f"{self.label}'s stream broke: {exc!r}") from None
        raise ReplicaUnreachable(f"{self.label}'s stream ended without a result")

    async def load_adapter(self, name: str, path: str) -> None:
        data = await self._post("/engine/load_adapter", {"name": name, "path": path})
        if name not in data.get("adapters", []):
            raise InfrastructureError(f"{self.label} does not list adapter {name!r} after loading")
        self.adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)
        await self._post("/engine/unload_adapter", {"name": name})

    def metrics(self) -> EngineMetrics:
        """The child's counters (plus those of its earlier lives) and gauges, read in the
        background at most every second; a scrape never waits."""
        now = time.monotonic()
        with self._lock:
            if not self._reading and now - self._read_at >= 1.0 and self.alive():
                self._reading, self._read_at = True, now
                threading.Thread(target=self._read_metrics, daemon=True).start()
            out = dataclasses.replace(self._last)
            for name in _COUNTERS:
                setattr(out, name, getattr(out, name) + getattr(self._carried, name))
            return out

    def _read_metrics(self) -> None:
        reading = None
        try:
            data = (
                httpx.get(self.url + "/engine/metrics", timeout=5, headers=self.headers)
                .raise_for_status()
                .json()
            )
            reading = EngineMetrics(**data)
        except (httpx.HTTPError, TypeError, ValueError) as exc:
            log.debug("could not read %s's metrics: %r", self.label, exc)
        with self._lock:
            self._reading = False
            if reading is not None:
                self._last = reading


# ----------------------------------------------------------------- vLLM child
class VLLMReplica:
    """A `VLLMEngine` (the client of its own managed vLLM server) as one replica."""

    def __init__(self, index: int, engine: Any) -> None:
        self.index, self.engine = index, engine
        self.adapters: dict[str, str] = engine._adapters  # the engine reloads them itself

    @property
    def label(self) -> str:
        pid = self.engine._child.pid
        return f"replica {self.index} (vLLM pid {pid or '?'}, {self.engine._url})"

    def alive(self) -> bool:
        return bool(self.engine.alive())

    def restart_sync(self) -> None:
        asyncio.run(self.engine._restart())

    def stop(self) -> None:
        self.engine.close_sync()

    def metrics(self) -> EngineMetrics:
        return self.engine.metrics()  # type: ignore[no-any-return]

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None
    ) -> GenerateResult:
        try:
            return await self.engine.generate(prompt_ids, sampling, adapter)  # type: ignore[no-any-return]
        except InfrastructureError as exc:
            if not self.alive():
                raise ReplicaUnreachable(f"{self.label}: {exc}") from None
            raise

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None
    ) -> AsyncIterator[TokenEvent | GenerateResult]:
        try:
            async for item in self.engine.stream(prompt_ids, sampling, adapter):
                yield item
        except InfrastructureError as exc:
            if not self.alive():
                raise ReplicaUnreachable(f"{self.label}: {exc}") from None
            raise

    async def load_adapter(self, name: str, path: str) -> None:
        await self.engine.load_adapter(name, path)

    async def unload_adapter(self, name: str) -> None:
        await self.engine.unload_adapter(name)


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return {"error": {"type": "infrastructure", "message": r.text[:500]}}
