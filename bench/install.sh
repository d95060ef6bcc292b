#!/usr/bin/env bash
# Copies Apache Kafka (the kafka_2.13 broker, kafka-tools' load generators and a log4j2 binding)
# from Maven Central into bench/java/target/lib (see bench/java/pom.xml), for the benchmarks that
# run it next to KafScale (bench/kafka_server.py, bench/kafka_perf.py).
# Idempotent: a no-op when the stamp in target/ matches pom.xml and the jars are there.
# One line on stdout; a failing build prints the tail of its log and exits non-zero.
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JAVA_DIR="$DIR/java"
TARGET="$JAVA_DIR/target"
LOG="$TARGET/mvn.log"
LIB="$TARGET/lib"
STAMP="$TARGET/.install-stamp"

started=$(date +%s%N)
say() {
    local ms=$((($(date +%s%N) - started) / 1000000))
    printf '[bench-install] kafka %s (%d.%01ds)\n' "$1" $((ms / 1000)) $((ms % 1000 / 100))
}
die() {
    printf '[bench-install] kafka FAILED: %s\n' "$1" >&2
    if [[ -f $LOG ]]; then
        printf -- '--- last lines of %s ---\n' "$LOG" >&2
        tail -n 40 "$LOG" >&2
    fi
    exit 1
}
jars_present() {
    compgen -G "$LIB/kafka_2.13-*.jar" >/dev/null &&
        compgen -G "$LIB/kafka-tools-[0-9]*.jar" >/dev/null &&
        compgen -G "$LIB/log4j-slf4j-impl-*.jar" >/dev/null
}

command -v mvn >/dev/null || die "mvn is not on PATH (scripts/install-deps.sh apt installs it)"

key="$(sha256sum "$JAVA_DIR/pom.xml" | cut -d' ' -f1)"
if [[ -f $STAMP && $(<"$STAMP") == "$key" ]] && jars_present; then
    say "jars up to date in bench/java/target/lib"
    exit 0
fi

# A clean copy, so a bumped version cannot leave the old jar next to the new one.
rm -rf "$TARGET"
mkdir -p "$TARGET"
mvn -q -B -Dstyle.color=never -f "$JAVA_DIR/pom.xml" package </dev/null >"$LOG" 2>&1 ||
    die "mvn package in $JAVA_DIR"
jars_present || die "mvn copied no kafka_2.13, kafka-tools or log4j-slf4j-impl jar"
printf '%s\n' "$key" >"$STAMP"
jars=("$LIB"/*.jar)
server=("$LIB"/kafka_2.13-*.jar)
version="${server[0]##*/kafka_2.13-}"
say "copied Kafka ${version%.jar}: ${#jars[@]} jars into bench/java/target/lib"
