#!/usr/bin/env bash
# Creates BFCL's own virtual environment in .venv-bfcl (or $ART_BFCL_VENV): the Berkeley
# Function Calling Leaderboard's package, `bfcl-eval`, whose data, possible answers and AST
# checker score examples/bfcl. Its pins (numpy 1.26.4, networkx 3.3, filelock 3.20.0, a
# dozen model SDKs) never meet ours: examples/bfcl/checker.py runs its checker from here as
# a subprocess. torch comes in through sentence-transformers, so constraints.txt pins its
# CPU build (without it pip fetches gigabytes of CUDA packages). soundfile: the checker
# imports every model handler, Qwen's among them, whose qwen-agent imports soundfile
# without declaring it.
# Re-runs are cheap: skipped while this script and constraints.txt are unchanged.
set -euo pipefail
# pip compiles no bytecode where Python may write it: scripts/setup.sh says why.
compile=()
[ -n "${PYTHONDONTWRITEBYTECODE:-}" ] || compile=(--no-compile)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ART_BFCL_VENV:-$root/.venv-bfcl}"
py="${PYTHON:-python3}"
stamp="$venv/.art-bfcl-stamp"
want="$(cat "$root/scripts/setup-bfcl.sh" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
echo "setup: installing bfcl-eval into $venv" >&2
"$venv/bin/python" -m pip install -q --upgrade pip >&2
"$venv/bin/python" -m pip install -q "${compile[@]}" -c "$root/constraints.txt" "bfcl-eval==2026.3.23" "soundfile==0.14.0" >&2
"$venv/bin/python" -c "from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker; print('setup: bfcl-eval ready')" >&2
echo "$want" > "$stamp"
