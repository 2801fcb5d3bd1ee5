"""Placement on Ray: connecting to a cluster, and what each replica and trainer rank asks of it.

`LocalBackend(ray=ADDRESS)` (`art-langgraph backend --ray ADDRESS`) makes its inference
replicas (`scaleout/ray_replica.py`) and its trainer ranks (`scaleout/ray_ranks.py`) Ray
actors instead of local child processes. Ray only places, starts and restarts them: the
step itself is HTTP to the replicas and torch.distributed between the ranks, as without
Ray.

- `connect(address)`: "local" starts a Ray instance inside this process (it ends with
  it); "auto" joins the cluster this machine is part of (`ray start` ran here, or
  `RAY_ADDRESS`); anything else is a Ray address ("host:6379", "ray://host:10001"). A
  process where `ray.init` was already called keeps that connection. Without Ray
  installed, the error names the extra.
- `shares(replicas, ranks)`: each actor's resource request. With GPUs in the cluster, one
  GPU and one CPU each (a rank or a replica never shares a GPU: NCCL needs one device per
  rank); without, the cluster's CPUs split evenly over the R + W actors (fractions allowed:
  generation and training take turns, as they do on one machine), and torch threads to
  match.
- `wait_ready(...)`: waits for an actor's first answer and turns the two ways a start
  fails into errors a user can act on: it never gets a place (no node has the resources,
  or the node never came up: the error names the request and what the cluster has), or it
  died while starting (the error has the end of its traceback and log).

Every node needs this package and the model in the same places (the usual Ray set-up: one
image or one shared environment), and the backend's `path` on a filesystem every node
reads: replicas load each checkpoint from it and rank 0 writes there.

Left out: autoscaling, placement groups (actors are placed one by one by their
resources), object-store URLs for checkpoints (fsspec), and Ray Serve.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

from art_langgraph.errors import InfrastructureError, MissingExtraError, UsageError


def ray_module() -> Any:
    """The `ray` module, or a `MissingExtraError` naming the `ray` extra."""
    try:
        import ray
    except ImportError as exc:
        raise MissingExtraError("ray", "ray") from exc
    return ray


def connect(address: str) -> Any:
    """Join (or start) the Ray cluster `address` names (see the module docstring); the
    `ray` module, connected."""
    ray = ray_module()
    if not isinstance(address, str) or not address.strip():
        raise UsageError("ray: give a Ray address, 'auto' (this machine's cluster) or 'local'")
    if ray.is_initialized():
        return ray
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    # The workers import this package from where this process found it.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    options["runtime_env"] = {"env_vars": {"PYTHONPATH": _with_root(root)}}
    try:
        if address == "local":
            ray.init(**options)
        else:
            ray.init(address=address, **options)
    except ConnectionError as exc:
        raise InfrastructureError(
            f"could not join the Ray cluster at {address!r}: {exc}. Start one with `ray start "
            "--head` (then --ray auto), or pass --ray local to start one in this process"
        ) from exc
    return ray


def _with_root(root: str) -> str:
    parts = [root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return os.pathsep.join(dict.fromkeys(parts))


@dataclasses.dataclass(frozen=True)
class ActorShare:
    """What one replica or rank actor asks of the cluster, and how it uses it."""

    num_cpus: float
    """Logical CPUs Ray reserves for it."""
    num_gpus: float
    """GPUs (0 or 1): with one, torch inside sees it as cuda:0."""
    threads: int
    """torch threads it runs (CPU work)."""

    @property
    def device(self) -> str:
        return "cuda:0" if self.num_gpus else "cpu"

    def options(self) -> dict[str, Any]:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}

    def describe(self) -> str:
        gpu = f", {self.num_gpus:g} GPU" if self.num_gpus else ""
        return f"{self.num_cpus:g} CPU{gpu}"


def shares(ray: Any, replicas: int, ranks: int) -> ActorShare:
    """One actor's share when R replicas and W ranks are placed on the cluster."""
    total = ray.cluster_resources()
    actors = max(1, replicas + ranks)
    if total.get("GPU", 0) >= 1:
        return ActorShare(num_cpus=1, num_gpus=1, threads=1)
    cpus = float(total.get("CPU", 1))
    each = math.floor(cpus / actors * 100) / 100 or 0.01  # Ray rounds requests to 1e-4
    return ActorShare(num_cpus=each, num_gpus=0, threads=max(1, int(each)))


def wait_ready(
    ray: Any, actor: Any, ref: Any, what: str, share: ActorShare, timeout_s: float
) -> Any:
    """The value of `ref` (the actor's first call), or an `InfrastructureError` that says why
    the actor did not start: never placed (the request and the cluster's resources), or
    died starting (the end of its error). The actor is killed in both cases."""
    ray_exceptions = ray.exceptions
    deadline = time.monotonic() + timeout_s
    while True:
        ready, _ = ray.wait([ref], timeout=min(2.0, max(0.0, deadline - time.monotonic())))
        if ready:
            try:
                return ray.get(ref)
            except ray_exceptions.RayError as exc:
                ray.kill(actor, no_restart=True)
                raise InfrastructureError(
                    f"{what} died while starting; the end of its error:\n{_last_lines(str(exc))}"
                ) from None
        if time.monotonic() >= deadline:
            state = _actor_state(ray, actor)
            ray.kill(actor, no_restart=True)
            if state in (None, "PENDING_CREATION", "DEPENDENCIES_UNREADY"):
                raise InfrastructureError(
                    f"{what} was not placed within {timeout_s:.0f} s: it asks for "
                    f"{share.describe()}, and no node that is up has that free (cluster: "
                    f"{_resources(ray.cluster_resources())}; free: "
                    f"{_resources(ray.available_resources())}; nodes up: {_nodes(ray)}). "
                    "A node that never joined, or too few CPUs/GPUs, looks like this"
                )
            raise InfrastructureError(
                f"{what} was placed but did not answer within {timeout_s:.0f} s (state {state})"
            )


def _actor_state(ray: Any, actor: Any) -> str | None:
    try:
        from ray.util.state import get_actor

        info = get_actor(actor._actor_id.hex())
        return None if info is None else str(info.state)
    except Exception:
        return None


def _resources(res: dict[str, float]) -> str:
    keep = {k: v for k, v in res.items() if k in ("CPU", "GPU")}
    return ", ".join(f"{v:g} {k}" for k, v in sorted(keep.items())) or "nothing"


def _nodes(ray: Any) -> str:
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
    except Exception:
        return "?"
    return ", ".join(str(n.get("NodeManagerAddress", "?")) for n in nodes) or "none"


def _last_lines(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
