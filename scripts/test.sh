#!/usr/bin/env bash
# The test command: sets up .venv, then runs lint, format check, the type checker, the
# docs build and the whole test suite (slow tests included). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
# vLLM's CPU build in its own environment (about 2-3 minutes the first time): the vllm
# tests are the only proof that the vLLM engine works, so CI runs them, and a missing
# environment fails the run instead of skipping them. ART_SKIP_VLLM=1 skips both.
if [ "${ART_SKIP_VLLM:-0}" != "1" ]; then
  "$root/scripts/setup-vllm.sh"
  export ART_REQUIRE_VLLM=1
fi
# Debian's Chromium for the review page's browser test (tests/test_review_page.py), from
# the Debian registry when this machine can install packages; the test then fails instead
# of skipping if the browser is missing. ART_SKIP_CHROMIUM=1 skips both.
if [ "${ART_SKIP_CHROMIUM:-0}" != "1" ]; then
  if ! command -v chromium >/dev/null && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "test: installing Debian's chromium for the browser test" >&2
    apt-get install -y -q chromium >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
      || echo "test: could not install chromium" >&2
  fi
  if command -v chromium >/dev/null; then
    export ART_REQUIRE_CHROMIUM=1
  fi
fi
venv="${ART_VENV:-$root/.venv}"
cd "$root"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy"
# The docs site (mkdocs.yml): strict, so a broken link, anchor or API reference fails the
# run. Not -q: mkdocs then drops the warnings before strict mode counts them.
NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict
set +e
"$venv/bin/python" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
