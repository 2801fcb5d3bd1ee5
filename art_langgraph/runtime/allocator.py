"""Run our command-line programs on tcmalloc instead of glibc's malloc.

torch's CPU tensors come straight from `malloc`. A training step frees and reallocates
activations of a few MiB each, interleaved with the ones kept for the backward pass, and
glibc serves such blocks from its heaps: the holes between long-lived blocks are never
returned, and whatever it does return is faulted back in on the next micro-batch.
tcmalloc keeps per-size free lists instead. Measured on SmolLM2-135M, one GRPO step of a
2 x 4 agent batch (2,116 tokens) on 2 AVX2 cores, the same process under each allocator
(`bench.trainer_roofline` has the whole-step figures):

| allocator | step (s) | peak RSS (MiB) | system time (s) |
|---|---|---|---|
| glibc (default) | 29.5 | 3,461 | 14.4 |
| jemalloc | 29.4 | 1,640 | 24.4 |
| tcmalloc (minimal) | 23.4 | 1,754 | 2.2 |

An allocator must be loaded before the process allocates anything, so
`reexec_with_tcmalloc()` restarts the running program once, with the library in
`LD_PRELOAD`, where it is installed (`scripts/setup.sh` installs Debian's
`libtcmalloc-minimal4` when it can) and not loaded yet. The restarted process takes
`LD_PRELOAD` back out of its environment, so the programs it starts (MCP servers, a vLLM
server) run as they would have. `art-mcp` and `art-langgraph` call it first thing;
`ART_ALLOCATOR=system` keeps glibc. A Python program of the user's that embeds a backend
can do the same by calling `art_langgraph.reexec_with_tcmalloc()` first thing, or by
starting under `LD_PRELOAD=<the path allocator_path() gives>`; a `LocalBackend` that trains
on the CPU under glibc says so once (`glibc_warning`). Measured on a BFCL step of
`examples/bfcl` (8 x 4 rollouts, one 8,007-token prefix-tree micro-batch, SmolLM2-135M
fp32, 2 AVX512-BF16 cores): peak RSS 8.1 GiB on glibc, 2.8 GiB on tcmalloc, where the live
tensors stayed near 2.3 GiB (a `malloc_trim` after the forward brought glibc back to it).

Left out: loading an allocator into a process already running (not possible), macOS and
other platforms (nothing happens there), jemalloc (half the memory too, but no faster).
"""

from __future__ import annotations

import glob
import os
import sys

_MARK = "_ART_ALLOCATOR_REEXEC"
"""Set in the restarted process's environment: the original LD_PRELOAD, or "" for none."""

_PATTERNS = (
    "/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
    "/usr/lib/libtcmalloc_minimal.so.4",
    "/usr/local/lib/libtcmalloc_minimal.so.4",
)


def allocator_path() -> str | None:
    """Where tcmalloc (gperftools' minimal build) is installed on this machine; None if not."""
    for pattern in _PATTERNS:
        for path in sorted(glob.glob(pattern)):
            if os.path.isfile(path):
                return path
    return None


def allocator_in_use() -> str:
    """ "tcmalloc", "jemalloc" or "glibc": the malloc this process runs on (Linux); "system"
    elsewhere."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "system"
    for name in ("tcmalloc", "jemalloc"):
        if name in maps:
            return name
    return "glibc"


def reexec_with_tcmalloc() -> None:
    """Restart this program on tcmalloc (see the module's docstring), or return at once: on
    a restarted process (it then restores LD_PRELOAD for its children), with
    ART_ALLOCATOR=system, off Linux, with another allocator loaded, or without tcmalloc."""
    if _MARK in os.environ:
        was = os.environ.pop(_MARK)
        if was:
            os.environ["LD_PRELOAD"] = was
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    if os.environ.get("ART_ALLOCATOR", "tcmalloc") == "system":
        return
    if not sys.platform.startswith("linux") or allocator_in_use() != "glibc":
        return
    path = allocator_path()
    if path is None:
        return
    was = os.environ.get("LD_PRELOAD", "")
    env = dict(os.environ, LD_PRELOAD=f"{path} {was}".strip(), **{_MARK: was})
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, *sys.orig_argv[1:]]
    os.execve(sys.executable, argv, env)


def glibc_warning() -> str | None:
    """What to tell a program that trains on the CPU under glibc's malloc (see above), or
    None where it runs on another allocator or off Linux."""
    if not sys.platform.startswith("linux") or allocator_in_use() != "glibc":
        return None
    path = allocator_path()
    how = (
        f"call art_langgraph.reexec_with_tcmalloc() first thing in main(), or start it "
        f"under LD_PRELOAD={path}"
        if path
        else "install tcmalloc (Debian: libtcmalloc-minimal4) and call "
        "art_langgraph.reexec_with_tcmalloc() first thing in main()"
    )
    return (
        "this process trains on glibc's malloc, whose freed activations stay resident: a "
        "training step can peak at 2-3x its live tensors (8.1 against 2.8 GiB measured on "
        f"tcmalloc, art_langgraph/runtime/allocator.py). To run on tcmalloc, {how}."
    )
