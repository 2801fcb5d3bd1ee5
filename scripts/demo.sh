#!/usr/bin/env bash
# The main job: sets up .venv, then trains an agent over the bundled MCP server
# (examples/mcp_server) with `art-mcp train` on the embedded default (CPU, tiny preset):
# held-out evaluation of the untrained model, SFT warm start on the train scenarios'
# demonstrations, then GRPO against the programmatic reward with held-out evaluation
# every 5 steps, and a report (JSON, markdown, PNG) in .art-demo/mcp/models/demo/ (or
# $ART_DEMO_PATH/...). A second run continues from the last checkpoint; delete the folder
# to start over. Extra arguments go to `art-mcp train`; `--real` first trains the real
# SmolLM2-135M-Instruct instead (see below and docs/mcp.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
venv="${ART_VENV:-$root/.venv}"
cd "$root"
out="${ART_DEMO_PATH:-.art-demo}"
# `./scripts/demo.sh --real`: the same job on the real SmolLM2-135M-Instruct, RL alone (no
# warm start: the untrained model already calls the right tool, and RL teaches it to finish
# with complete_task), a bf16 engine and bf16 autocast in the trainer. Experimental (see
# docs/mcp.md for its time, memory and spread).
name=demo
args=(--sft-epochs 28 --steps 30 --eval-every 5 --eval-samples 0)
if [ "${1:-}" = "--real" ]; then
  shift
  name=demo-real
  args=(--base-model smollm2-135m --sft-epochs 0 --steps 8 --eval-every 4 --groups-per-step 4
    --max-turns 3 --learning-rate 2e-4 --compute-dtype bfloat16 --engine-dtype bfloat16
    --micro-batch-tokens 2048)
fi
"$venv/bin/python" -m art_mcp.cli train \
    --server "$venv/bin/python -m examples.mcp_server.server" \
    --scenarios examples/mcp_server/scenarios.jsonl \
    --reward examples.mcp_server.tasks:score \
    --tool-choice required "${args[@]}" \
    --path "$out" --name "$name" "$@"
cat "$out/mcp/models/$name/report.md"
