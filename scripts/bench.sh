#!/usr/bin/env bash
# Run the benchmarks of bench/ against KafScale and Apache Kafka on this machine:
#   scripts/bench.sh                     every scenario, every target (about 20 minutes)
#   scripts/bench.sh produce-acks1-p1 consume-tail --targets kafscale,kafka
# Installs what they need first (idempotent): the test suite's dependencies (MinIO, etcd, the
# venv: scripts/install-deps.sh), the `bench` extra (matplotlib, py-spy) and Apache Kafka's jars
# (bench/install.sh). Results: bench/results/<date>.{json,md} and plots; see bench/README.md.
# Run it on an otherwise idle machine: every figure is compared within the run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh apt minio python
mkdir -p .tools/logs
if ! .venv/bin/python -m pip install -q --disable-pip-version-check --no-input \
    -e '.[test,spark,bench]' </dev/null >.tools/logs/pip-bench.log 2>&1; then
    tail -n 40 .tools/logs/pip-bench.log >&2
    echo "[bench] pip install -e '.[test,spark,bench]' FAILED" >&2
    exit 1
fi
bash bench/install.sh

if [[ $# -eq 0 ]]; then
    set -- all
fi
exec .venv/bin/python -m bench.run "$@"
