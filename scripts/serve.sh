#!/usr/bin/env bash
# Run a KafScale broker on the embedded defaults: segments under ./data/segments, metadata in
# ./data/metadata.sqlite, Kafka listener on 127.0.0.1:9092, metrics on :9093.
#   scripts/serve.sh [kafscale serve flags...]      e.g. scripts/serve.sh --broker-port 19092
# The first run creates .venv and installs the broker alone into it (not the test, Spark or
# operator extras); later runs start at once.
# Every KAFSCALE_* variable in the environment is honoured (see the README's table).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install-deps.sh" broker >&2
exec "$ROOT/.venv/bin/kafscale" serve "$@"
