#!/usr/bin/env bash
# Installs kafkajs and its codec plugins (tests/compat/node/package-lock.json) into
# tests/compat/node/node_modules with `npm ci`, from the npm registry only.
# Idempotent: a no-op when the stamp in node_modules matches package-lock.json and Node's version.
# One line on stdout; a failing install prints the tail of its log and exits non-zero.
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$DIR/../../.." && pwd)"
LOG_DIR="$ROOT/.tools/logs"
LOG="$LOG_DIR/kafkajs-npm.log"
STAMP="$DIR/node_modules/.kafscale-install-stamp"

started=$(date +%s%N)
say() {
    local ms=$((($(date +%s%N) - started) / 1000000))
    printf '[install-deps] %-7s %s (%d.%01ds)\n' kafkajs "$1" $((ms / 1000)) $((ms % 1000 / 100))
}
die() {
    printf '[install-deps] %-7s FAILED: %s\n' kafkajs "$1" >&2
    if [[ -f $LOG ]]; then
        printf -- '--- last lines of %s ---\n' "$LOG" >&2
        tail -n 40 "$LOG" >&2
    fi
    exit 1
}

command -v node >/dev/null || die "node is not on PATH (Node.js 20+ is needed)"
command -v npm >/dev/null || die "npm is not on PATH"

key="$(node -v) $(sha256sum "$DIR/package.json" "$DIR/package-lock.json" | cut -d' ' -f1 | tr '\n' ' ')"
if [[ -f $STAMP && $(<"$STAMP") == "$key" ]]; then
    say "node_modules up to date in tests/compat/node"
    exit 0
fi

mkdir -p "$LOG_DIR"
(cd "$DIR" && npm ci --no-audit --no-fund) >"$LOG" 2>&1 || die "npm ci in $DIR"
# The native lz4 binding and the zstd WebAssembly must load under this node.
(cd "$DIR" && node -e "require('lz4'); require('@bokuweb/zstd-wasm').init()") >>"$LOG" 2>&1 ||
    die "the codec plugins do not load"
printf '%s\n' "$key" >"$STAMP"
say "installed $(cd "$DIR" && node -p "'kafkajs ' + require('kafkajs/package.json').version") into tests/compat/node/node_modules"
