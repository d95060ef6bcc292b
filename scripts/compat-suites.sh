#!/usr/bin/env bash
# Other projects' integration suites against KafScale, in one command on a fresh machine:
#   scripts/compat-suites.sh [kgo] [kafka-python]     (default: both)
# Installs what they need (scripts/install-deps.sh), then runs `python -m tests.compat.suites`:
# franz-go's pkg/kgo tests (Go module proxy) and kafka-python's test/integration (PyPI sdist),
# each against a fresh `kafscale serve` on etcd + MinIO. Results go to tests/compat/results/ and
# docs/compatibility.md. Takes about 25 minutes on 2 cores; not part of .ci/run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install-deps.sh
exec "$ROOT/.venv/bin/python" -m tests.compat.suites "$@"
