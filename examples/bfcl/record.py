"""What a BFCL run's result is stamped with: the commit and the code that ran, and the
peak resident memory of each of its phases.

`code_hash` names the trees that decide a result (CODE_PATHS), so runs of one code pool in
one table even when a docs commit lies between them (`bench.learning_bfcl`'s rule);
`commit_stamp` is HEAD's short hash, "+dirty" when tracked files differ. Left out: the
host's flags and allocator (art_langgraph.runtime reads those).
"""

from __future__ import annotations

import hashlib
import resource
import subprocess
from pathlib import Path

CODE_PATHS = ("art_langgraph", "examples/bfcl", "constraints.txt", "pyproject.toml")
"""What decides a run's result, besides its arguments: runs whose trees of these agree
pool in one table even when their commits differ (a docs commit between two runs)."""


def _git(*a: str) -> str:
    return subprocess.run(["git", *a], capture_output=True, text=True, check=False).stdout


class PhasePeaks:
    """Peak resident memory of each phase of the run: at a phase's end the kernel's
    high-water mark (VmHWM) is read and reset (`/proc/self/clear_refs`), so each phase
    reports its own peak. Where the reset is not possible (not Linux), the marks are
    cumulative, and `resettable` (the result's `peak_rss_phases_apart`) says so."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self.resettable = self._reset()

    @staticmethod
    def _reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def end(self, phase: str) -> None:
        """Record the peak since the last `end` under `phase` (the highest, if repeated)."""
        try:
            with open("/proc/self/status") as f:
                kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
        except (OSError, StopIteration):
            kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        gib = round(kib / 2**20, 2)
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), gib)
        self._reset()

    def overall(self) -> float:
        return max([*self.peaks.values(), 0.0])


def commit_stamp(checkout: Path | None = None) -> str:
    """HEAD's short hash, with "+dirty" when tracked files differ from it (of the current
    folder's checkout, or of `checkout`)."""
    at = ["-C", str(checkout)] if checkout is not None else []
    head = _git(*at, "rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + (
        "+dirty" if _git(*at, "status", "--porcelain", "--untracked-files=no").strip() else ""
    )


def code_hash() -> str:
    """A hash of CODE_PATHS' trees at HEAD, with "+dirty" when any of them differs from it."""
    trees = [_git("rev-parse", f"HEAD:{p}").strip() for p in CODE_PATHS]
    if not all(trees):
        return "unknown"
    digest = hashlib.sha1(" ".join(trees).encode()).hexdigest()[:12]
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS).strip()
    return digest + ("+dirty" if changed else "")
