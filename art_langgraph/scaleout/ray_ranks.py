"""Trainer ranks as Ray actors: the `RankLauncher` that `DistributedTrainer(ray=...)` uses.

Each rank is a `RankActor` placed by its resources (`ray_cluster.shares`: a GPU each where
the cluster has GPUs, else a share of its CPUs). Its `run` call connects back to this
process and then is a rank like a local child: it reads its spec, joins the torch process
group (gloo, or NCCL on GPUs) at this node's rendezvous store, and serves the trainer's
commands (`rank.serve`) until told to close.

The connection back: a TCP socket this process listens on at its node's address, one
per rank, authenticated with a random key (the HMAC challenge of
`multiprocessing.connection`) before anything is read from it, since the commands are
pickled; an unauthenticated peer is dropped.

Deaths: the actor is created with `max_restarts=0`. The rank's `run` call doubles as its
life: when the actor dies the call fails, `RayRankProcess.poll` says so, and the trainer
fails the step whole (see `scaleout/distributed.py`); the backend then starts a new set.

Left out: restarting one rank alone (a process group cannot take a new member mid-life).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import time
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any

from art_langgraph.errors import InfrastructureError
from art_langgraph.scaleout.ray_cluster import ActorShare, shares, wait_ready


class RankActor:
    """A trainer rank in a Ray actor (see the module docstring)."""

    def pid(self) -> int:
        return os.getpid()

    def run(self, address: tuple[str, int], key: bytes) -> None:
        """Connect back, join the group, serve commands; returns when told to close."""
        from art_langgraph.scaleout.rank import serve

        conn = Client(address, authkey=key)
        spec = conn.recv()
        _gloo_on_node_interface()
        serve(conn, spec)


def _gloo_on_node_interface() -> None:
    """Point gloo at the interface holding this node's Ray address (the one peers reach)."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    from ray.util import get_node_ip_address

    try:
        import psutil
    except ImportError:  # gloo then picks the interface of this host's name
        return

    ip = get_node_ip_address()
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


class RayRankProcess:
    """A rank actor seen as a process: alive while its `run` call is pending."""

    def __init__(self, ray: Any, actor: Any, run: Any, pid: int) -> None:
        self.ray, self.actor, self.run, self.pid = ray, actor, run, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, _ = self.ray.wait([self.run], timeout=0)
            if done:
                try:
                    self.ray.get(self.run)
                    self.returncode = 0
                except Exception:
                    self.returncode = -9  # killed, or died: Ray does not say which signal
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        done, _ = self.ray.wait([self.run], timeout=timeout)
        if not done:
            raise subprocess.TimeoutExpired(f"trainer rank actor (pid {self.pid})", timeout or 0)
        code = self.poll()
        assert code is not None
        return code

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(self.actor, no_restart=True)


class RayLauncher:
    """Starts rank actors and connects them to this process (see the module docstring)."""

    def __init__(
        self, ray: Any, ranks: int, share: ActorShare | None, start_timeout_s: float
    ) -> None:
        from ray.util import get_node_ip_address

        self.ray = ray
        self.share = share or shares(ray, 0, ranks)
        self.threads = self.share.threads
        self.device = self.share.device
        self.host = get_node_ip_address()
        self.start_timeout_s = start_timeout_s

    def launch(self, rank: int) -> tuple[RayRankProcess, Connection]:
        what = f"trainer rank {rank} (a Ray actor)"
        cls = self.ray.remote(RankActor)
        actor = cls.options(**self.share.options(), max_restarts=0, max_task_retries=0).remote()
        pid = wait_ready(
            self.ray, actor, actor.pid.remote(), what, self.share, self.start_timeout_s
        )
        key = secrets.token_bytes(32)
        with socket.create_server((self.host, 0)) as server:
            run = actor.run.remote(server.getsockname()[:2], key)
            proc = RayRankProcess(self.ray, actor, run, pid)
            try:
                return proc, self._accept(server, key, proc, what)
            except BaseException:
                proc.kill()
                raise

    def _accept(
        self, server: socket.socket, key: bytes, proc: RayRankProcess, what: str
    ) -> Connection:
        """The rank's authenticated connection; gives up when its actor dies or time runs out."""
        deadline = time.monotonic() + self.start_timeout_s
        server.settimeout(0.5)
        while True:
            try:
                sock, _ = server.accept()
            except TimeoutError:
                if proc.poll() is not None:
                    with contextlib.suppress(Exception):
                        self.ray.get(proc.run)
                    raise InfrastructureError(f"{what} died before connecting back") from None
                if time.monotonic() > deadline:
                    raise InfrastructureError(
                        f"{what} did not connect back to {self.host} within "
                        f"{self.start_timeout_s:.0f} s (a firewall between the nodes?)"
                    ) from None
                continue
            sock.settimeout(None)
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, key)
                answer_challenge(conn, key)
            except Exception:  # not our rank: drop it, keep waiting
                conn.close()
                continue
            return conn
