#!/usr/bin/env bash
# The test command: sets up .venv, then runs lint, format check, the type checker, the
# docs build and the whole test suite: the main job and the slow job (tests marked
# `slow_job`: a slower path to what a main-job test already proves, such as a second front
# end on the vLLM engine). Both run by default, as CI runs them, in one pytest run on two
# pytest-xdist workers; `--main` runs only the main job, `--slow-job` only the slow job's
# tests. Other arguments go to pytest.
set -euo pipefail
job=all
case "${1:-}" in
  --main) job=main; shift ;;
  --slow-job) job=slow; shift ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Python caches the bytecode of what the tests import in their environments, which the
# set-ups then leave uncompiled (scripts/setup.sh): an image's PYTHONDONTWRITEBYTECODE
# would make every process the tests start compile all it imports.
unset PYTHONDONTWRITEBYTECODE
# vLLM's CPU build in its own environment (about 2-3 minutes the first time), set up beside
# the main environment, lint and type checks (both set-ups are mostly one pip each, and
# there are 2 cores): the vllm tests are the only proof that the vLLM engine works, so CI
# runs them, and a missing environment fails the run instead of skipping them.
# ART_SKIP_VLLM=1 skips both.
vllm_setup=""
kill_tree() {  # a process and its descendants: nothing started here outlives the script
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
if [ "${ART_SKIP_VLLM:-0}" != "1" ]; then
  "$root/scripts/setup-vllm.sh" &
  vllm_setup=$!
fi
# BFCL's environment (bfcl-eval and its pins, about 2 minutes the first time), beside the
# others: examples/bfcl's tests score through its checker, and a missing environment fails
# the run instead of skipping them. ART_SKIP_BFCL=1 skips both.
bfcl_setup=""
if [ "${ART_SKIP_BFCL:-0}" != "1" ]; then
  "$root/scripts/setup-bfcl.sh" &
  bfcl_setup=$!
fi
checks=""  # the type checker and the docs build, beside the tests (below)
checks_log="$(mktemp)"
trap 'for p in $vllm_setup $bfcl_setup $checks; do kill_tree "$p"; done; rm -f "${checks_log:-}"' EXIT
"$root/scripts/setup.sh"
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
if [ "$job" != "slow" ]; then
  "$venv/bin/ruff" check .
  "$venv/bin/ruff" format --check .
  # The type checker and the docs site (mkdocs.yml; strict, so a broken link, anchor or API
  # reference fails the run; not -q: mkdocs then drops the warnings before strict mode
  # counts them) run beside the tests, on one core for about a minute and a half, and
  # their output and verdict come after the tests': run one by hand for a quick answer.
  ( "$venv/bin/mypy" && NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict ) \
    >"$checks_log" 2>&1 &
  checks=$!
fi
if [ -n "$vllm_setup" ]; then
  wait "$vllm_setup" || { echo "test: setting up .venv-vllm failed" >&2; exit 1; }
  vllm_setup=""
  export ART_REQUIRE_VLLM=1
fi
if [ -n "$bfcl_setup" ]; then
  wait "$bfcl_setup" || { echo "test: setting up .venv-bfcl failed" >&2; exit 1; }
  bfcl_setup=""
  export ART_REQUIRE_BFCL=1
fi
# Two pytest-xdist workers ($ART_TEST_WORKERS; 0 runs one process): most tests start a
# server or a CLI process and keep one core busy, so two at a time fill both cores
# (docs/development.md has the timings). tests/conftest.py keeps each file, every SmolLM2
# file and every vLLM file on one worker (WORKER_GROUPS) and hands out first the group of
# long tests (the BFCL learning arm, the main job), one after the other on one worker,
# while the other worker takes the rest. Both jobs (the default) are one pytest run, so
# no group's fixtures start twice and no job waits on the other's last test.
workers="${ART_TEST_WORKERS:-2}"
case "$job" in
  main) echo "test: the main job" >&2; marks=(-m "not slow_job") ;;
  slow) echo "test: the slow job (tests marked slow_job)" >&2; marks=(-m "slow_job") ;;
  *) echo "test: the main job and the slow job" >&2; marks=() ;;
esac
# pytest's exit 5 (no test collected, as a -k or a path that picks nothing in the job
# gives) is a failure, not a pass.
set +e
"$venv/bin/python" -m pytest -n "$workers" --dist loadscope "${marks[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  rc=1
fi
if [ -n "$checks" ]; then
  set +e
  wait "$checks"
  checks_rc=$?
  set -e
  checks=""
  cat "$checks_log" >&2
  if [ "$checks_rc" -ne 0 ]; then
    echo "test: the type checker or the docs build failed (above)" >&2
    [ "$rc" -ne 0 ] || rc=1
  fi
fi
exit "$rc"
