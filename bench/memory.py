"""Peak memory of a process tree, as the benchmarks report it: `tree_peak_rss_mib`.

Reads `/proc` (Linux only): each process's high-water mark (VmHWM), summed over the
process and its descendants. Left out: memory of processes that already exited (their
peaks are gone from `/proc`), and any other platform.
"""

from __future__ import annotations

from pathlib import Path


def tree_peak_rss_mib(pid: int, root: bool = True) -> float:
    """Peak RSS (VmHWM) of a process and its children, summed; without the process's own
    where `root` is False (a supervisor's, say)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:") and (root or p != pid):
                    total += int(line.split()[1])
            for t in Path(f"/proc/{p}/task").iterdir():
                children = (t / "children").read_text().split()
                todo += [int(c) for c in children]
        except OSError:
            continue
    return total / 1024
