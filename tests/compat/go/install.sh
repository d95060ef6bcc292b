#!/usr/bin/env bash
# Builds the franz-go driver of the compatibility tests (tests/harness/franz_go.py) into
# .tools/bin/kafscale-franz-go, with modules from the Go module proxy (go.mod/go.sum pin them).
# Idempotent: skipped when the stamp of go.mod, go.sum and the .go files matches the last build.
# Prints one line, like the steps of scripts/install-deps.sh.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
TOOLS="$ROOT/.tools"
BIN="$TOOLS/bin/kafscale-franz-go"
STAMP="$TOOLS/bin/.kafscale-franz-go.stamp"
LOG="$TOOLS/logs/franz-go.log"

if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH="/usr/local/go/bin:$PATH"
fi
export GOPATH="${GOPATH:-$HOME/go}"
export GOMODCACHE="${GOMODCACHE:-$GOPATH/pkg/mod}"
export GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off

started=$(date +%s%N)
say() { # one line with the step's duration
    local ms=$((($(date +%s%N) - started) / 1000000))
    printf '[install-deps] %-7s %s (%d.%01ds)\n' franz-go "$1" $((ms / 1000)) $((ms % 1000 / 100))
}

mkdir -p "$TOOLS/bin" "$TOOLS/logs"
stamp="$(cd "$HERE" && cat go.mod go.sum ./*.go | sha256sum | cut -d' ' -f1)"
if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$stamp" ]]; then
    say "kafscale-franz-go up to date"
    exit 0
fi
command -v go >/dev/null || {
    printf '[install-deps] %-7s FAILED: go is not installed\n' franz-go >&2
    exit 1
}
if ! (cd "$HERE" && nice -n 10 go build -trimpath -o "$BIN.tmp" .) >"$LOG" 2>&1; then
    printf '[install-deps] %-7s FAILED: go build\n--- last lines of %s ---\n' franz-go "$LOG" >&2
    tail -n 40 "$LOG" >&2
    rm -f "$BIN.tmp"
    exit 1
fi
mv -f "$BIN.tmp" "$BIN"
printf '%s\n' "$stamp" >"$STAMP"
say "built $(cd "$HERE" && go list -m -f '{{.Path}}@{{.Version}}' github.com/twmb/franz-go) into .tools/bin/kafscale-franz-go"
