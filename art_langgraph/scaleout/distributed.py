"""`DistributedTrainer`: a `Trainer` of W data-parallel LoRA ranks in worker processes.

Each rank is a `LoRATrainer` (its own copy of the base model; the same seed, so the same
initial adapter) in a process of its own, joined by torch.distributed: gloo on CPUs, NCCL
when each rank has a CUDA device of its own (`cuda:{rank}`). A step's sequences are split
over the ranks by tokens (`shard`, deterministic); each rank runs its micro-batches with
the loss divided by the *whole step's* token and sequence counts, the LoRA gradients are
summed in one all-reduce, and every rank clips and steps its optimizer on the same sum:
all ranks hold the same adapter and optimizer state (compared before each save) and the
update is the single-process one up to float rounding. Rank 0 writes checkpoints; every
rank loads them.

Launch: the parent starts W `python -c` processes itself (`subprocess`), each with a
socket pair for commands and results, and hosts the rendezvous (a TCPStore on 127.0.0.1,
on a port the OS picks: no race for a free port). Not multiprocessing's spawn: it
re-imports the user's `__main__`, which a training script without an `if __name__ ==
"__main__"` guard would run again in every rank. Not torchrun: the backend is a
long-lived server that starts, watches and stops its ranks with the model. A rank needs
only (rank, world size, store), so a torchrun entry point would be a few lines over
`rank.serve` (`scaleout/rank.py`).

Failure: a rank that dies or raises fails the whole step. The parent kills every rank (a
survivor may hold an update the others lack), closes the trainer and raises (the rank's
own exception, or `TrainerRankError`); the backend then builds a new trainer from the
latest checkpoint, as after any failed step. Ranks never outlive the parent: each exits
when its parent's pid changes (orphaned), and the parent kills them at exit.

Launchers (`RankLauncher`): `LocalLauncher` starts the ranks as child processes;
`scaleout/ray_ranks.RayLauncher` as Ray actors on any node of a cluster (then the
rendezvous and the command connections use this node's address, and the connections are
authenticated). A rank actor that dies is not restarted alone: a torch process group
cannot take a new member mid-life, so the step fails whole and the backend starts a new
set of ranks from the latest checkpoint, as torchrun's elastic agent restarts all workers.

FSDP (`fsdp=True`, or None: when the base's weights take more than 40% of a rank's CUDA
device, never on the CPU): each rank holds 1/W of the base, the adapter and the optimizer
state (`LoRATrainer` with `fsdp`, FSDP2 per decoder layer); the ranks decide together, all
of them gather the state for rank 0 to write, and the checkpoint is the same files (it
loads into a plain trainer and the engine). The digest before a save then compares only
what the ranks replicate (the optimizer's step counts): their shards differ by design.
Measured (tiny model, gloo, 2 CPU cores, W=2 against W=1): the same loss, grad norm and
metrics, and adapters within 2.1e-6 after two steps, each rank holding half the base.

Left out: sharing the engine's weights (each rank loads its own copy), and Windows (the
ranks' sockets are passed as inherited file descriptors). NCCL, and so FSDP on GPUs, is
untested.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import weakref
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, NoReturn, Protocol

from art_langgraph.errors import TrainerRankError, UsageError
from art_langgraph.runtime.devices import pick_device
from art_langgraph.training.base import ProgressFn
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.training.tensorize import TrainSequence

_ENTRY = "import sys; from art_langgraph.scaleout.rank import main; main(int(sys.argv[1]))"


def shard(seqs: list[TrainSequence], ranks: int) -> list[list[TrainSequence]]:
    """Split a step's sequences over `ranks` by tokens: longest first, each onto the rank
    with the fewest tokens so far (ties: the lower rank); each share keeps the step's order.
    Balanced by all tokens (what the forward pass costs), not only the trained ones; a
    sequence is never split, so sequence-level ratios (GSPO) stay whole."""
    loads = [0] * ranks
    owner = [0] * len(seqs)
    for i in sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i)):
        r = min(range(ranks), key=lambda r: (loads[r], r))
        owner[i] = r
        loads[r] += len(seqs[i])
    return [[s for s, o in zip(seqs, owner, strict=True) if o == r] for r in range(ranks)]


class DistributedTrainer:
    """W `LoRATrainer` ranks in worker processes, data-parallel over each step's sequences."""

    fsdp: bool = False
    """Whether the ranks shard the model (FSDP): as `fsdp` asked, or as the ranks chose."""

    def __init__(
        self,
        base_path: str,
        config: ModelConfig,
        ranks: int = 2,
        device: str | None = None,
        *,
        start_timeout_s: float = 600.0,
        ray: Any = None,
        share: Any = None,
        fsdp: bool | None = None,
    ) -> None:
        """`ranks`: worker processes (W >= 1). `device`: as for `LoRATrainer`; "cuda" puts
        rank r on cuda:r (W CUDA devices needed), the CPU splits its cores between ranks.
        `start_timeout_s`: how long the ranks may take to load the model and meet. `ray`:
        the connected `ray` module (`ray_cluster.connect`) to run the ranks as Ray actors
        (`scaleout/ray_ranks.py`), each asking for `share` (a `ray_cluster.ActorShare`;
        None: `shares(ray, 0, ranks)`); `device` is then the share's. `fsdp`: shard the
        base model, the adapter and its optimizer state over the ranks (FSDP2, each rank
        holds 1/W); None: when the base's weights take more than rank.FSDP_AUTO_FRACTION of a
        rank's CUDA device (never on the CPU), True/False: always/never."""
        import torch.distributed as dist

        if ranks < 1:
            raise UsageError(f"ranks must be >= 1, got {ranks}")
        self.ranks = ranks
        launcher: RankLauncher
        if ray is None:
            self.devices, self.backend = _placement(pick_device(device), ranks)
            launcher = LocalLauncher(ranks, self.backend)
        else:
            from art_langgraph.scaleout.ray_ranks import RayLauncher

            launcher = RayLauncher(ray, ranks, share, start_timeout_s)
            self.devices = [launcher.device] * ranks
            self.backend = "nccl" if launcher.device.startswith("cuda") else "gloo"
        self._procs: list[RankProcess] = []
        self._conns: list[Connection] = []
        self._closed = False
        # Killed at exit or when this object goes, whichever comes first.
        self._finalizer = weakref.finalize(self, _kill, self._procs)
        self._store: Any = None
        # The rendezvous listens only on the launcher's address (loopback for local ranks):
        # given no socket, torch's store would listen on every interface. The store owns
        # the socket from here on (it closes it).
        listener = socket.create_server((launcher.host, 0))
        self.rendezvous: tuple[str, int] = listener.getsockname()[:2]
        """Where the ranks meet (the address the store listens on, and its port)."""
        fd = listener.detach()
        try:
            store = dist.TCPStore(
                launcher.host,
                self.rendezvous[1],
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=start_timeout_s),
                master_listen_fd=fd,
            )
        except BaseException:
            os.close(fd)
            raise
        try:
            self._store = store  # the rendezvous lives as long as the ranks
            for rank in range(ranks):
                proc, conn = launcher.launch(rank)
                self._procs.append(proc)
                self._conns.append(conn)
                conn.send(
                    {
                        "rank": rank,
                        "world": ranks,
                        "host": launcher.host,
                        "port": store.port,
                        "backend": self.backend,
                        "device": self.devices[rank],
                        "base_path": base_path,
                        "config": config,
                        "threads": launcher.threads,
                        "parent_pid": os.getpid(),
                        "timeout_s": start_timeout_s,
                        "fsdp": fsdp,
                    }
                )
            self._call("start", dict.fromkeys(range(ranks), ()), deadline=start_timeout_s)
            self.fsdp = bool(self._call("describe", {0: ()})[0]["fsdp"])
        except BaseException:
            self.close_now()
            raise

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids, rank order (Ray actors: on their nodes)."""
        return [p.pid for p in self._procs]

    # ------------------------------------------------------------------ Trainer
    def rl_step(
        self, seqs: list[TrainSequence], config: TrainConfig, progress: ProgressFn | None = None
    ) -> dict[str, float]:
        """One GRPO step over `seqs`, split over the ranks; the metrics are the whole step's.
        `progress`: each rank's micro-batches (info has its "rank"; "tokens" over all ranks
        sum to "total_tokens"), then rank 0's optimizer step."""
        shares = shard(seqs, self.ranks)
        want = progress is not None
        out = self._call(
            "rl_step", {r: (shares[r], config, want) for r in range(self.ranks)}, progress
        )
        return {**out[0], "trainer_ranks": float(self.ranks)}

    def sft_step(self, seqs: list[TrainSequence], config: TrainConfig) -> dict[str, float]:
        """One SFT step over `seqs`, split over the ranks."""
        shares = shard(seqs, self.ranks)
        out = self._call("sft_step", {r: (shares[r], config) for r in range(self.ranks)})
        return {**out[0], "trainer_ranks": float(self.ranks)}

    def save(self, folder: Path) -> None:
        """Rank 0 writes the adapter and optimizer state, once every rank is shown to hold
        the same (a digest of their tensors; under FSDP of the state they all replicate, the
        step counts); ranks that differ fail the save. Under FSDP every rank gathers its
        shards for rank 0 to write: the files are the same as without."""
        digests = self._call("digest", dict.fromkeys(range(self.ranks), ()))
        if odd := [r for r, d in digests.items() if d != digests[0]]:
            self._fail("save", odd[0], None, "its adapter or optimizer state differs from rank 0's")
        writers = range(self.ranks) if self.fsdp else [0]
        self._call("save", dict.fromkeys(writers, (Path(folder),)))

    def param_numel(self) -> dict[int, dict[str, int]]:
        """Each rank's `LoRATrainer.param_numel`: what it holds of the base and the adapter
        (under FSDP about 1/W of each)."""
        described = self._call("describe", dict.fromkeys(range(self.ranks), ()))
        return {r: d["params"] for r, d in described.items()}

    def load(self, folder: Path) -> None:
        """Every rank restores `folder`; any failure (a `CheckpointError`) closes the trainer."""
        self._call("load", dict.fromkeys(range(self.ranks), (Path(folder),)))

    def close(self) -> None:
        """Stop the ranks: asked first, killed after 10 s. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(("close", ()))
        end = time.monotonic() + 10
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))
        self._finalizer()
        for conn in self._conns:
            conn.close()
        self._store = None

    # ---------------------------------------------------------------- plumbing
    def _call(
        self,
        op: str,
        args: dict[int, tuple[Any, ...]],
        progress: ProgressFn | None = None,
        deadline: float | None = None,
    ) -> dict[int, Any]:
        """Send `op` to the ranks in `args`; their results by rank. Any rank dying (asked or
        not) or raising fails the call: every rank is stopped and the trainer closed."""
        if self._closed:
            raise UsageError(
                "this DistributedTrainer is closed (a step failed, or close() was called): "
                "build a new one and load the latest checkpoint"
            )
        try:
            return self._exchange(op, args, progress, deadline)
        except BaseException:
            self.close_now()  # a step cut short (a failure, an interrupt) leaves no rank behind
            raise

    def _exchange(
        self,
        op: str,
        args: dict[int, tuple[Any, ...]],
        progress: ProgressFn | None,
        deadline: float | None,
    ) -> dict[int, Any]:
        if op != "start":
            for r, a in args.items():
                try:
                    self._conns[r].send((op, a))
                except OSError:
                    self._fail(op, r, None)
        pending = {self._conns[r]: r for r in args}
        results: dict[int, Any] = {}
        limit = None if deadline is None else time.monotonic() + deadline
        while pending:
            for conn in wait(list(pending), timeout=1.0):
                assert isinstance(conn, Connection)
                r = pending[conn]
                try:
                    kind, value = conn.recv()
                except (EOFError, OSError):
                    self._fail(op, r, None)
                if kind == "progress":
                    stage, info = value
                    if progress is not None and (stage == "micro_batch" or r == 0):
                        progress(stage, info)
                elif kind == "ok":
                    results[r] = value
                    del pending[conn]
                else:
                    dead = self._first_dead(within_s=1.0)
                    if dead is not None and dead != r:  # r failed in a collective with it
                        last = value[1].splitlines()[-1] if value[1] else "?"
                        self._fail(op, dead, None, f"rank {r} then failed: {last}")
                    self._fail(op, r, value)
            for r, proc in enumerate(self._procs):
                if proc.poll() is not None:
                    self._fail(op, r, None)
            if limit is not None and pending and time.monotonic() > limit:
                self._fail(op, min(pending.values()), None, f"no answer in {deadline:.0f} s")
        return results

    def _first_dead(self, within_s: float) -> int | None:
        """A rank that has exited, waiting up to `within_s` for one: when a rank reports an
        error, a peer's death is the cause to report (the rank failed waiting for it)."""
        end = time.monotonic() + within_s
        while True:
            if dead := [r for r, p in enumerate(self._procs) if p.poll() is not None]:
                return dead[0]
            if time.monotonic() >= end:
                return None
            time.sleep(0.05)

    def _fail(self, op: str, rank: int, error: Any, detail: str = "") -> NoReturn:
        """Stop every rank, close, and raise the rank's own error (when it crossed the
        process boundary intact) or a `TrainerRankError`."""
        proc = self._procs[rank]
        if error is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)  # a rank whose socket closed is exiting: take its code
        code = proc.poll()
        self.close_now()
        if error is None:
            raise TrainerRankError(rank, op, code, detail)
        exc, text = error
        if not isinstance(exc, BaseException):  # it did not survive pickling: its words
            exc = TrainerRankError(rank, op, code, text.splitlines()[-1] if text else "")
        else:
            exc.add_note(f"raised in trainer rank {rank} during {op}; every rank was stopped")
        exc.add_note(f"the rank's traceback:\n{text}")
        raise exc

    def close_now(self) -> None:
        """Kill the ranks without asking (after a failure). Idempotent."""
        self._closed = True
        self._finalizer()
        for conn in self._conns:
            conn.close()
        self._store = None


class RankProcess(Protocol):
    """What the trainer needs of a rank's process: `subprocess.Popen`, or a Ray actor's
    handle (`scaleout/ray_ranks.py`)."""

    @property
    def pid(self) -> int: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


class RankLauncher(Protocol):
    """Starts rank processes and connects to them: `LocalLauncher` (child processes) or
    `ray_ranks.RayLauncher` (Ray actors)."""

    host: str
    """The address the ranks reach this process's rendezvous store at."""
    threads: int
    """torch threads per rank."""

    def launch(self, rank: int) -> tuple[RankProcess, Connection]:
        """Start rank `rank`: its process, and a connection on which it reads its spec."""
        ...


class LocalLauncher:
    """Ranks as child processes of this one (`python -c`, a socket pair each)."""

    host = "127.0.0.1"

    def __init__(self, ranks: int, backend: str) -> None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self.threads = max(1, (cores or os.cpu_count() or 1) // ranks)
        self._env = _rank_env(self.threads if backend == "gloo" else None)

    def launch(self, rank: int) -> tuple[RankProcess, Connection]:
        ours, theirs = socket.socketpair()
        with theirs:
            proc = subprocess.Popen(
                [sys.executable, "-c", _ENTRY, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=self._env,
                stdin=subprocess.DEVNULL,
            )
        return proc, Connection(ours.detach())


def _kill(procs: list[RankProcess]) -> None:
    # Unconditionally: a Ray rank's `run` call may have returned (after "close", or a
    # failed join) while its actor still holds its GPU; killing an exited child is a no-op.
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=30)


def _placement(device: str, ranks: int) -> tuple[list[str], str]:
    """Each rank's device, and the collective backend: NCCL with a CUDA device per rank,
    gloo on the CPU. One rank takes `device` as it is."""
    if ranks == 1 or not device.startswith("cuda"):
        if device == "cuda":  # a rank sets its device, which needs an index
            device = "cuda:0"
        return [device] * ranks, "nccl" if device.startswith("cuda") else "gloo"
    import torch

    found = torch.cuda.device_count()
    if device != "cuda" or found < ranks:
        raise UsageError(
            f"{ranks} trainer ranks on {device!r} need {ranks} CUDA devices (device='cuda', "
            f"rank r on cuda:r); this machine has {found}. Use fewer ranks, or device='cpu'"
        )
    return [f"cuda:{r}" for r in range(ranks)], "nccl"


def _rank_env(threads: int | None) -> dict[str, str]:
    """The parent's environment, with this package importable (from wherever the parent
    imported it), gloo on the loopback interface, and each rank's share of the CPU's threads."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with contextlib.suppress(OSError, AttributeError):
        loopback = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
        if loopback and "GLOO_SOCKET_IFNAME" not in env:
            env["GLOO_SOCKET_IFNAME"] = loopback[0]
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env
