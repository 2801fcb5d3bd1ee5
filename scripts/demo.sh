#!/usr/bin/env bash
# The main job: sets up .venv, then trains SmolLM2-135M-Instruct as an agent that must
# chain tools over the bundled two-hop MCP server (examples/mcp_org: a fictional
# company's projects and staff; "the extension of the lead of project X" takes
# project_lead, then lookup on the lead it returned) with `art-mcp train` and the
# library's defaults, on the embedded default backend: the untrained model's held-out
# evaluation, a three-epoch SFT warm start on the task's 64 demonstrations, the evaluation
# before RL, GRPO steps against the task's programmatic reward, the evaluation after RL,
# and a report (JSON, markdown, PNG) in .art-demo/mcp/models/demo/ (or
# $ART_DEMO_PATH/...). The held-out scenarios name projects, people and phrasings the
# training never sees. A second run continues from the last checkpoint; delete the
# folder to start over. Extra arguments go to `art-mcp train`
# (`--shuffle-rewards true --name control` is the control arm; `art-mcp check` with the
# same arguments is the pre-flight). Its time, memory and spread: docs/results.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
venv="${ART_VENV:-$root/.venv}"
cd "$root"
out="${ART_DEMO_PATH:-.art-demo}"
name=demo
for arg in "$@"; do  # a --name given goes to the report printed at the end
  if [ "${prev:-}" = "--name" ]; then name="$arg"; fi
  prev="$arg"
done
"$venv/bin/python" -m art_mcp.cli train \
    --server "$venv/bin/python -m examples.mcp_org.server" \
    --scenarios examples/mcp_org/scenarios.jsonl \
    --reward examples.mcp_org.tasks:score \
    --path "$out" --name demo "$@"
cat "$out/mcp/models/$name/report.md"
