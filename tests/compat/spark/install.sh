#!/usr/bin/env bash
# Copies Spark's Kafka source (spark-sql-kafka-0-10) and the jars it needs beyond pyspark's own
# into tests/compat/spark/target/jars (see pom.xml), from Maven Central, for
# tests/compat/test_spark_kafka.py.
# Idempotent: a no-op when the stamp in target/ matches pom.xml and the jars are there.
# One line on stdout; a failing build prints the tail of its log and exits non-zero.
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$DIR/../../.." && pwd)"
LOG_DIR="$ROOT/.tools/logs"
LOG="$LOG_DIR/spark-kafka-mvn.log"
TARGET="$DIR/target"
JARS="$TARGET/jars"
STAMP="$TARGET/.install-stamp"

started=$(date +%s%N)
say() {
    local ms=$((($(date +%s%N) - started) / 1000000))
    printf '[install-deps] %-7s %s (%d.%01ds)\n' spark-kafka "$1" \
        $((ms / 1000)) $((ms % 1000 / 100))
}
die() {
    printf '[install-deps] %-7s FAILED: %s\n' spark-kafka "$1" >&2
    if [[ -f $LOG ]]; then
        printf -- '--- last lines of %s ---\n' "$LOG" >&2
        tail -n 40 "$LOG" >&2
    fi
    exit 1
}

command -v mvn >/dev/null || die "mvn is not on PATH (scripts/install-deps.sh apt installs it)"

key="$(sha256sum "$DIR/pom.xml" | cut -d' ' -f1)"
if [[ -f $STAMP && $(<"$STAMP") == "$key" ]] &&
    compgen -G "$JARS/spark-sql-kafka-*.jar" >/dev/null; then
    say "spark-sql-kafka jars up to date in tests/compat/spark/target/jars"
    exit 0
fi

mkdir -p "$LOG_DIR"
# A clean copy, so a bumped version cannot leave the old jar next to the new one.
rm -rf "$TARGET"
mvn -q -B -Dstyle.color=never -f "$DIR/pom.xml" package </dev/null >"$LOG" 2>&1 ||
    die "mvn package in $DIR"
compgen -G "$JARS/spark-sql-kafka-*.jar" >/dev/null || die "mvn copied no spark-sql-kafka jar"
printf '%s\n' "$key" >"$STAMP"
say "copied $(cd "$JARS" && echo *.jar) into tests/compat/spark/target/jars"
