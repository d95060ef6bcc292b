#!/usr/bin/env bash
# The long fault run of docs/design/scale-out.md in one command:
#   scripts/chaos.sh [--faults 100] [--seed N] [--interval 0.01] [--max-minutes M] [--keep]
# 3 brokers on a 3-member etcd cluster and MinIO under idempotent acks=all load; faults drawn
# from the seed, one at a time (SIGKILL, SIGSTOP past the lease, SIGTERM of a broker; SIGKILL of
# an etcd member; MinIO stopped), each waited out until the load is acknowledged again on every
# partition; then everything is read back and checked (tests/harness/history.py). Writes
# tests/chaos/results/YYYY-MM-DD-HHMM.md and exits non-zero if the run failed. About 40 s a
# fault on 2 cores; not part of .ci/run (the short versions are tests/integration/
# test_scale_out*.py). Expects scripts/install-deps.sh to have run (etcd, MinIO).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m tests.chaos.run "$@"
