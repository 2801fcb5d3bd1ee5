#!/usr/bin/env bash
# BFCL through the LangGraph swap-in, in one command: sets up .venv (scripts/setup.sh) and
# BFCL's own environment (.venv-bfcl, scripts/setup-bfcl.sh), then runs examples/bfcl:
# SmolLM2-135M-Instruct inside a LangGraph app, each BFCL item's functions bound as its
# tools, evaluated by BFCL's own AST checker on a fixed held-out sample before and after
# 6 GRPO steps with the library's defaults. Extra arguments go to `python -m
# examples.bfcl` (`--seed N`, `--control` for the shuffled-reward arm, `--out DIR`). The
# result (BFCL's pass/fail per held-out item, the phases' time, the commit) goes to
# runs/bfcl/result.json, or DIR. Its time, memory and the table of seeds: docs/bfcl.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/setup-bfcl.sh"
venv="${ART_VENV:-$root/.venv}"
cd "$root"
exec "$venv/bin/python" -m examples.bfcl "$@"
