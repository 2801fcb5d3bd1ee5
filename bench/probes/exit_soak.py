"""Exit soak: scripts that serve chat calls from a `LocalBackend` they never close, run as
fresh processes, and how each one ended.

Each variant is a user's script (the README's pattern: `model.register(art.LocalBackend())`,
no `close()`) that makes concurrent chat calls on the real model, logs them through a
logger of its own (which writes what it got when it is closed), and then ends one way:

| variant | ends by | expected exit |
|---|---|---|
| `plain` | returning from `main` | 0 |
| `raises` | an exception after its calls | 1 (Python's for an uncaught exception) |
| `sigterm` | SIGTERM while calls are in flight | killed by SIGTERM |
| `sigint` | SIGINT (Ctrl-C) while calls are in flight | killed by SIGINT (Python re-raises it) |
| `wandb` | returning, with W&B's offline logger too | 0, the W&B run's records on disk |

A run passes when it exits as expected, printed no abort (`terminate called`, `Fatal Python
error`), its logger (where it has one) was flushed with the logged trajectories, and no
process of its group is left. `plain` and `raises` are the issue's script as it was
reported: calls and no logger of its own. Before the fix (issue 52), `plain` aborted (SIGABRT, 134) in about a third of the
runs on a 2-core host: a daemon thread of the engine was still running when Python
finalized (art_langgraph/backend/shutdown.py).

    python -m bench.probes.exit_soak                      # plain, 20 runs
    python -m bench.probes.exit_soak --variant all --runs 3 --busy   # beside a busy core

`--root` runs the scripts against another checkout (today's main, say) with this one's
harness. Results go to bench/results/exit_soak/exit_soak_<variant>.json. Left out: SIGKILL
(nothing runs; checkpoints are atomic and child processes watch their parent).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from art_langgraph.runtime.devices import matmul_flags
from bench.readme import ROOT, results_dir, write_results

_SCRIPT = """
import asyncio, json, os, sys
from pathlib import Path

import art_langgraph as art

END, FOLDER, LOGGED, WANDB = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"


class FileLogger:  # a user's TrajectoryLogger: writes what it was given when it is closed
    def __init__(self, path):
        self.path, self.got = path, []

    def log_trajectories(self, run, step, split, groups):
        self.got.append(sum(len(g) for g in groups))

    def log_metrics(self, run, step, split, metrics):
        pass

    def close(self):
        self.path.write_text(json.dumps({"trajectories": self.got}))


async def main():
    loggers = [FileLogger(FOLDER / "flushed.json")] if LOGGED else None
    if WANDB:
        from art_langgraph.integrations.wandb import WandbLogger

        loggers.append(WandbLogger(dir=str(FOLDER)))
    model = art.TrainableModel(name="probe", project="exit", base_model="smollm2-135m")
    await model.register(art.LocalBackend(path=FOLDER / "art", loggers=loggers))
    chat = model.chat_model(temperature=0, max_tokens=16)

    async def call(i):
        with art.capture() as traj:
            await chat.ainvoke(f"Say a number {i}")
        traj.reward = 1.0
        return traj

    if LOGGED:
        group = art.TrajectoryGroup(await asyncio.gather(*(call(i) for i in range(8))))
        await model.log([group])
    else:  # the issue's script: its calls, then the end, the engine's thread winding down
        await asyncio.gather(*(chat.ainvoke(f"Say a number {i}") for i in range(8)))
    print("ready", flush=True)
    if END == "raises":
        raise RuntimeError("the script failed after its calls")
    if END == "signal":  # calls in flight until the signal comes
        busy = model.chat_model(temperature=1.0, max_tokens=64)
        parent = os.getppid()
        while os.getppid() == parent:  # until the signal, or until the soak is gone
            await asyncio.gather(*(busy.ainvoke(f"Count to {i}") for i in range(8)))


asyncio.run(main())
"""


@dataclass(frozen=True)
class Variant:
    end: str
    """What the script does after its logged calls: "return", "raises" or "signal"."""
    signal: int | None = None
    """The signal sent once the script prints "ready" (with end="signal")."""
    expected_rc: int = 0
    """The exit status Python gives such an ending without us (a signal's is negative)."""
    logged: bool = True
    """Capture its calls and log them through a logger of its own, which must be flushed.
    Off: the calls alone, as in the issue's script (a logger's close at exit is enough of a
    delay that the old code aborted less often with one: 0 of 8 runs against 2 of 8)."""
    wandb: bool = False
    """Also log to W&B's offline logger, and check its run file is on disk."""


VARIANTS = {
    "plain": Variant("return", logged=False),
    "raises": Variant("raises", expected_rc=1, logged=False),
    "sigterm": Variant("signal", signal.SIGTERM, -signal.SIGTERM),
    "sigint": Variant("signal", signal.SIGINT, -signal.SIGINT),
    "wandb": Variant("return", wandb=True),
}

_ABORTS = ("terminate called", "Fatal Python error", "Aborted")


@dataclass
class Outcome:
    variant: str
    rc: int
    ok: bool
    why: str
    """Empty when ok; else what failed."""
    seconds: float


def run_variant(
    name: str, folder: Path, *, root: Path = ROOT, python: str = sys.executable
) -> Outcome:
    """Run variant `name` once in a fresh process (a session of its own) and judge its end."""
    v = VARIANTS[name]
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "script.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    start = time.monotonic()
    proc = subprocess.Popen(
        [python, str(script), v.end, str(folder), str(int(v.logged)), str(int(v.wandb))],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )
    try:
        if v.signal is not None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == "ready":
                    time.sleep(1.0)  # into the next batch of calls
                    proc.send_signal(v.signal)
                    break
        _, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:  # a hang: where each thread stood, then kill it
        stacks = _stacks(proc.pid, python)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        why = (
            f"still running {HANG_S} s after its end; its threads: {stacks}; stderr: {err[-1500:]}"
        )
        return Outcome(name, proc.returncode, False, why, round(time.monotonic() - start, 1))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.monotonic() - start
    why = _judge(v, proc.returncode, err, folder, proc.pid)
    return Outcome(name, proc.returncode, not why, why, round(seconds, 1))


def _as_from_a_terminal() -> None:
    """In the script's process, before it starts: Ctrl-C's default action, as a script
    started from a terminal has. A soak started in the background by a shell (`cmd &`)
    inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the
    `sigint` script ran on past its signal until the hang guard killed it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


HANG_S = 180
"""A script still running this long after it started is hung (one takes 15-20 s alone on 2
cores, about twice that beside a busy core)."""


def _stacks(pid: int, python: str) -> str:
    """Every thread's Python stack of process `pid`, by py-spy from `python`'s environment
    (a dependency of the test environment), or why there are none."""
    spy = Path(python).parent / "py-spy"
    if not spy.is_file():
        return "(no py-spy beside the interpreter)"
    try:
        out = subprocess.run(
            [str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(py-spy failed: {exc})"
    return (out.stdout or out.stderr)[-6000:]


def _judge(v: Variant, rc: int, stderr: str, folder: Path, pgid: int) -> str:
    problems = []
    if rc != v.expected_rc:
        problems.append(f"exit {rc}, expected {v.expected_rc}")
    if aborts := [a for a in _ABORTS if a in stderr]:
        problems.append(f"aborted ({', '.join(aborts)})")
    flushed = folder / "flushed.json"
    if v.logged and not flushed.is_file():
        problems.append("the logger was never closed")
    elif v.logged and json.loads(flushed.read_text())["trajectories"] != [8]:
        problems.append(f"the logger got {flushed.read_text()}, not the 8 trajectories")
    if v.wandb and not any(p.stat().st_size > 0 for p in folder.glob("wandb/*/run-*.wandb")):
        problems.append("no W&B run file on disk")
    try:
        os.killpg(pgid, 0)
        problems.append("a process of the script's group outlived it")
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if problems and "Traceback" in stderr:
        problems.append("stderr: " + stderr[-600:])
    return "; ".join(problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="plain", choices=[*VARIANTS, "all"])
    ap.add_argument("--runs", type=int, default=20, help="runs of each variant")
    ap.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose code runs")
    ap.add_argument(
        "--out", type=Path, default=None, help="the JSON file (default: bench/results/exit_soak/)"
    )
    args = ap.parse_args()
    names = list(VARIANTS) if args.variant == "all" else [args.variant]
    spin = "import os\np = os.getppid()\nwhile os.getppid() == p: pass"  # ends with the soak
    busy = subprocess.Popen([sys.executable, "-c", spin]) if args.busy else None
    # the code that runs, read before the runs
    commit = subprocess.run(
        ["git", "-C", str(args.root), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    outcomes: list[Outcome] = []
    try:
        with tempfile.TemporaryDirectory(prefix="exit-soak-") as tmp:
            for name in names:
                for i in range(args.runs):
                    o = run_variant(name, Path(tmp) / f"{name}-{i}", root=args.root.resolve())
                    outcomes.append(o)
                    print(f"{name} run {i + 1}: exit {o.rc}, {o.seconds} s, {o.why or 'ok'}")
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    flags = matmul_flags()
    print(f"\ncommit {commit}, {'one core busy' if args.busy else 'alone'}, CPU flags: {flags}")
    print("| variant | runs | as expected | aborted |\n|---|---:|---:|---:|")
    summary = []
    for name in names:
        mine = [o for o in outcomes if o.variant == name]
        aborted = sum("aborted" in o.why for o in mine)
        passed = sum(o.ok for o in mine)
        summary.append({"variant": name, "runs": len(mine), "passed": passed, "aborted": aborted})
        print(f"| {name} | {len(mine)} | {passed} | {aborted} |")
    name = f"exit_soak_{args.variant}{'_busy' if args.busy else ''}.json"
    write_results(
        args.out or results_dir("exit_soak") / name,
        {
            "commit": commit,  # the --root checkout's, which may not be this one
            "args": {k: str(v) for k, v in vars(args).items()},
            "cpu_flags": flags,
            "summary": summary,
            "runs": [asdict(o) for o in outcomes],
        },
    )
    if any(not o.ok for o in outcomes):
        sys.exit(1)


if __name__ == "__main__":
    main()
