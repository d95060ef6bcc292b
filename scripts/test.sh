#!/usr/bin/env bash
# Install everything and run the whole test suite: the one command the README gives.
#   scripts/test.sh [PYTEST ARGS...]     e.g. scripts/test.sh -k harness -x
# Steps: scripts/install-deps.sh, ruff check, ruff format --check, mypy, pytest (xdist with
# work stealing, pytest-timeout, JUnit XML in .tools/results/junit.xml) and, after a full run,
# the check that docs/compatibility.md's client matrix is the one this run proved
# (tests/compat/report.py). Every check runs even if an earlier one failed, so one run shows all
# problems; the exit status is non-zero if any failed. pytest collecting no test (exit 5) is a
# failure. PYTEST_WORKERS (default 2) and PYTEST_TIMEOUT (seconds per test, default 300) tune
# pytest. A full run (no arguments) leaves out the tests marked `long` (long fault scenarios whose
# shorter relatives run here): scripts/long-tests.sh runs them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh

BIN="$ROOT/.venv/bin"
failed=()

run() { # run NAME COMMAND...: one check, recorded if it fails
    local name=$1
    shift
    echo "=== $name"
    if "$@"; then
        echo "--- $name: ok"
    else
        local rc=$?
        echo "--- $name: FAILED (exit $rc)"
        failed+=("$name")
    fi
}

run "ruff check" "$BIN/ruff" check .
run "ruff format --check" "$BIN/ruff" format --check --output-format concise .
run "mypy" "$BIN/mypy"

echo "=== pytest"
set +e
mkdir -p .tools/results
# --dist worksteal: xdist's default hands each worker a long share of the tests up front, and
# with minute-long integration tests one worker was left with most of them while the other sat
# idle (37 min against 22 min for the same suite on this machine).
selection=("$@")
[[ $# -gt 0 ]] || selection=(-m "not long")
"$BIN/python" -m pytest -n "${PYTEST_WORKERS:-2}" --dist worksteal --timeout "${PYTEST_TIMEOUT:-300}" \
    --junitxml=.tools/results/junit.xml --durations=25 "${selection[@]}"
rc=$?
set -e
case $rc in
    0) echo "--- pytest: ok" ;;
    5)
        echo "--- pytest: FAILED: no tests were collected (exit 5)"
        failed+=("pytest (no tests collected)")
        ;;
    *)
        echo "--- pytest: FAILED (exit $rc)"
        failed+=("pytest")
        ;;
esac

# The published compatibility matrix (docs/compatibility.md) must be what this run proved; only
# a full run proves every cell.
if [[ $# -eq 0 ]]; then
    run "compatibility matrix" "$BIN/python" -m tests.compat.report --check
fi

if [[ ${#failed[@]} -gt 0 ]]; then
    printf 'test.sh: FAILED:'
    printf ' [%s]' "${failed[@]}"
    printf '\n'
    exit 1
fi
echo "test.sh: all checks passed"
