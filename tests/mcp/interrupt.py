"""Run a command as a user does, pressing Ctrl-C once it prints a given line (the
harness's resume tests)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


def run_until(
    cmd: list[str], cwd: Path, interrupt_after: str | None
) -> subprocess.CompletedProcess[str]:
    """`cmd` run in `cwd`; with `interrupt_after`, Ctrl-C (SIGINT) as soon as a line
    containing it is printed. Its exit code, stdout (every line) and stderr."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    lines = []
    for line in p.stdout:
        lines.append(line)
        if interrupt_after is not None and interrupt_after in line:
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=600)
    return subprocess.CompletedProcess(cmd, p.returncode, "".join(lines) + out, err)
