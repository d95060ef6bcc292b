#!/usr/bin/env bash
# Run the web console (`kafscale console`, docs/console.md) next to scripts/serve.sh's broker:
# Kafka at 127.0.0.1:9092, its metrics at :9093, its metadata in ./data; the console on
# http://127.0.0.1:8088. There is no default login: set KAFSCALE_UI_USERNAME and
# KAFSCALE_UI_PASSWORD first.
#   KAFSCALE_UI_USERNAME=me KAFSCALE_UI_PASSWORD='a long passphrase' scripts/console.sh
# The first run installs the console's extra into .venv; later runs start at once. Every
# KAFSCALE_* variable in the environment is honoured (docs/console.md, "Settings").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install-deps.sh" console >&2
export KAFSCALE_CONSOLE_HOST="${KAFSCALE_CONSOLE_HOST:-127.0.0.1}"
export KAFSCALE_CONSOLE_BOOTSTRAP="${KAFSCALE_CONSOLE_BOOTSTRAP:-127.0.0.1:9092}"
export KAFSCALE_CONSOLE_METRICS_URLS="${KAFSCALE_CONSOLE_METRICS_URLS-http://127.0.0.1:9093/metrics}"
export KAFSCALE_DATA_DIR="${KAFSCALE_DATA_DIR:-./data}"
exec "$ROOT/.venv/bin/kafscale" console "$@"
