#!/usr/bin/env bash
# The long fault scenarios left out of .ci/run, in one command on a fresh machine:
#   scripts/long-tests.sh [PYTEST ARGS...]
# The tests marked `long` (pyproject.toml): a rolling restart of three brokers under load, scaling
# one broker to three and back, a crashed broker restarted at once, an etcd follower killed, etcd
# stopped for a minute, S3 paused under load, shards killed through a 30 s S3 pause, 100,000
# mutated frames against a live broker, three of the four "group coordinator fails during a
# rebalance" cases, and a KIP-848 group's coordinator killed under Java members. Their shorter
# relatives (a SIGKILLed leader, a paused owner, the etcd leader killed, etcd paused, MinIO
# stopped, shards killed through a 10 s S3 pause, 20,000 frames, a coordinator killed during a
# join, the KIP-848 coordinator killed or paused under confluent-kafka members) run in .ci/run;
# scripts/chaos.sh draws many such faults in a row. About 15 minutes on 2 cores. Installs what
# they need first (scripts/install-deps.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install-deps.sh
exec "$ROOT/.venv/bin/python" -m pytest -n "${PYTEST_WORKERS:-2}" --dist worksteal \
    --timeout "${PYTEST_TIMEOUT:-300}" -m long "$@"
