#!/usr/bin/env bash
# The main job: sets up .venv, then trains an agent over the bundled MCP server
# (examples/mcp_server) with `art-mcp train` on the embedded default (CPU, tiny preset):
# held-out evaluation of the untrained model, SFT warm start on the train scenarios'
# demonstrations, then GRPO against the programmatic reward with held-out evaluation
# every 5 steps, and a report (JSON, markdown, PNG) in .art-demo/mcp/models/demo/ (or
# $ART_DEMO_PATH/...). A second run continues from the last checkpoint; delete the folder
# to start over. Extra arguments go to `art-mcp train`: `--base-model smollm2-135m` trains
# the real SmolLM2-135M-Instruct instead (slow on 2 CPU cores; see the README).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
venv="${ART_VENV:-$root/.venv}"
cd "$root"
out="${ART_DEMO_PATH:-.art-demo}"
"$venv/bin/python" -m art_mcp.cli train \
    --server "$venv/bin/python -m examples.mcp_server.server" \
    --scenarios examples/mcp_server/scenarios.jsonl \
    --reward examples.mcp_server.tasks:score \
    --tool-choice required --sft-epochs 28 --steps 30 --eval-every 5 --eval-temperature 0 \
    --path "$out" --name demo "$@"
cat "$out/mcp/models/demo/report.md"
