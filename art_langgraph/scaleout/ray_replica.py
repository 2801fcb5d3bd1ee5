"""An inference replica as a Ray actor: a `TorchEngine` behind our server, on any node.

`ReplicaActor` is the actor: it loads the engine and serves the same app as a local
replica child (`scaleout/replica_server.serve`: `/v1` and the token-level `/engine` routes),
bound to its node's address and guarded by an API key that only this backend knows (a
fresh random key per replica). `RayReplica` is the `ReplicaEngine`'s side of it: the HTTP
client of a local `TorchReplica`, with the process handling swapped for Ray's.

Restarts are Ray's: the actor is created with `max_restarts=-1`, so when its process dies
Ray starts it again (on any node with room). The supervisor of `ReplicaEngine` sees the
death (`alive()`: the actor's never-ending `hold()` call came back with an error), waits
for the new life to answer, takes its new address and reloads the adapters it held. If Ray
cannot bring it back within the start timeout, a new actor is created instead.

Left out: vLLM replicas on Ray (a managed vLLM server per actor would need its GPU
bookkeeping); they run as local processes only (`ReplicaEngine.start_vllm`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from art_langgraph.errors import InfrastructureError
from art_langgraph.scaleout.ray_cluster import ActorShare, wait_ready
from art_langgraph.scaleout.replica_clients import TorchReplica
from art_langgraph.scaleout.replica_server import serve


class ReplicaActor:
    """The actor: a served `TorchEngine` (see the module docstring). Its methods run in
    threads (`max_concurrency`), so `hold` never blocks `info`."""

    def __init__(self, base: str, config: dict[str, Any], threads: int, api_key: str) -> None:
        from ray.util import get_node_ip_address

        self._server, self._info = serve(
            base, config, threads, "base", host=get_node_ip_address(), api_key=api_key
        )

    def info(self) -> dict[str, Any]:
        """{host, port, pid, context_length, vocab_size}."""
        return self._info

    def hold(self) -> None:
        """Never returns: its caller learns of the actor's death when this call fails."""
        threading.Event().wait()


class RayReplica(TorchReplica):
    """One `ReplicaActor`, spoken to over HTTP like a local replica child."""

    def __init__(
        self,
        index: int,
        ray: Any,
        base_path: str,
        config: Any,
        share: ActorShare,
        startup_timeout_s: float,
    ) -> None:
        if config.device is None:
            config = dataclasses.replace(config, device=share.device)
        super().__init__(
            index, base_path, config, share.threads, Path(os.devnull), startup_timeout_s
        )
        self.ray, self.share = ray, share
        self._key = secrets.token_urlsafe(32)
        self.headers = {"Authorization": f"Bearer {self._key}"}
        self._actor: Any = None
        self._hold: Any = None

    @property
    def label(self) -> str:
        where = self.url or "not started"
        return f"replica {self.index} (Ray actor, pid {self.info.get('pid', '?')}, {where})"

    @property
    def pid(self) -> int | None:
        """The actor's process id in its current life (on its node)."""
        pid = self.info.get("pid")
        return int(pid) if pid is not None else None

    # ------------------------------------------------------------- process
    def spawn(self) -> None:
        """Create the actor and wait until it serves."""
        cls = self.ray.remote(ReplicaActor)
        self._actor = cls.options(
            **self.share.options(),
            max_restarts=-1,
            max_task_retries=0,
            max_concurrency=4,
        ).remote(self.base_path, dataclasses.asdict(self.config), self.threads, self._key)
        self._attach()

    def _attach(self) -> None:
        """Wait for the actor's current life to answer; take its address, watch its life."""
        what = f"replica {self.index} (a Ray actor)"
        self.info = wait_ready(
            self.ray,
            self._actor,
            self._actor.info.remote(),
            what,
            self.share,
            self.startup_timeout_s,
        )
        self.url = f"http://{self.info['host']}:{self.info['port']}"
        self._hold = self._actor.hold.remote()

    def alive(self) -> bool:
        if self._hold is None:
            return False
        done, _ = self.ray.wait([self._hold], timeout=0)
        return not done

    def stop(self) -> None:
        actor, self._actor, self._hold = self._actor, None, None
        if actor is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)

    def restart_sync(self) -> None:
        """Wait for Ray's restart of the actor (a new actor if it does not come back), then
        reload the adapters it held."""
        self._carry_counters()
        try:
            if self._actor is None:
                raise InfrastructureError("no actor")
            self._attach()
        except InfrastructureError:
            self.spawn()
        self._reload_adapters()
