"""art-mcp and art-langgraph restart themselves on tcmalloc where it is installed, once,
and leave the programs they start on the system's malloc."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from art_langgraph.runtime.allocator import allocator_in_use, allocator_path

# What the restarted program sees, and what a program it starts sees.
PROBE = """
import json, os, subprocess, sys
from art_langgraph.runtime.allocator import allocator_in_use, reexec_with_tcmalloc
reexec_with_tcmalloc()
child = subprocess.run([sys.executable, "-c",
    "from art_langgraph.runtime.allocator import allocator_in_use; print(allocator_in_use())"],
    capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"self": allocator_in_use(), "preload": os.environ.get("LD_PRELOAD"),
                  "child": child, "argv": sys.argv[1:]}))
"""


def _probe(**env: str) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "a", "--b"],
        capture_output=True,
        text=True,
        check=True,
        env={**{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, **env},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


needs_tcmalloc = pytest.mark.skipif(
    allocator_path() is None or allocator_in_use() == "system",
    reason="no tcmalloc on this machine (scripts/setup.sh installs it where it can)",
)


@needs_tcmalloc
def test_a_program_restarts_on_tcmalloc_with_its_arguments() -> None:
    seen = _probe()
    assert seen["self"] == "tcmalloc" and seen["argv"] == ["a", "--b"]
    assert seen["preload"] is None and seen["child"] == "glibc"  # children run as before


@needs_tcmalloc
def test_an_earlier_ld_preload_is_kept_for_children() -> None:
    seen = _probe(LD_PRELOAD="")
    assert seen["self"] == "tcmalloc" and seen["preload"] is None
    lib = allocator_path()
    assert lib is not None
    seen = _probe(LD_PRELOAD=lib)  # already on tcmalloc: no restart, nothing changed
    assert seen["self"] == "tcmalloc" and seen["preload"] == lib


def test_art_allocator_system_keeps_glibc() -> None:
    seen = _probe(ART_ALLOCATOR="system")
    assert seen["self"] in ("glibc", "system") and seen["child"] in ("glibc", "system")


@needs_tcmalloc
@pytest.mark.parametrize(
    ("module", "shown"), [("art_mcp.cli", "train"), ("examples.bfcl", "--steps")]
)
def test_our_programs_run_on_tcmalloc(module: str, shown: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
    )
    assert shown in out.stdout  # the restarted program parsed its arguments


WARNING_PROBE = """
import json
from art_langgraph.runtime.allocator import allocator_in_use, glibc_warning, reexec_with_tcmalloc
import sys
if sys.argv[1] == "restart":
    reexec_with_tcmalloc()
print(json.dumps({"self": allocator_in_use(), "warning": glibc_warning()}))
"""


def _warning(mode: str) -> dict[str, str | None]:
    out = subprocess.run(
        [sys.executable, "-c", WARNING_PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_a_trainer_on_glibc_is_told_how_to_leave_it() -> None:
    seen = _warning("stay")
    assert seen["self"] == "glibc"
    assert seen["warning"] is not None and "reexec_with_tcmalloc()" in seen["warning"]


@needs_tcmalloc
def test_nothing_to_tell_on_tcmalloc() -> None:
    seen = _warning("restart")
    assert seen == {"self": "tcmalloc", "warning": None}
