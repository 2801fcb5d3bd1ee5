#!/usr/bin/env bash
# The main job: sets up .venv, then runs the demo on the embedded default (CPU, tiny
# preset model). Extra arguments go to the demo.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
venv="${ART_VENV:-$root/.venv}"
cd "$root"
exec "$venv/bin/python" -m examples.server_chat "$@"
