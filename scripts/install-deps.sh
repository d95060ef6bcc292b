#!/usr/bin/env bash
# Installs everything KafScale's test suite needs, from the package registries only:
#   apt     etcd-server, etcd-client, kcat, chromium with fonts-liberation and fonts-dejavu-core
#           (the browser of the console's tests: Playwright drives it and downloads none), and
#           a JDK + Maven if missing
#   minio   MinIO built from the Go module proxy at a pinned version, into .tools/bin/minio
#   python  .venv with `pip install -e '.[test,spark,operator,console]'` (step `broker`:
#           `pip install -e .`, the broker alone, for scripts/serve.sh; step `console`:
#           `pip install -e '.[console]'`, for scripts/console.sh)
#   java    the kafka-clients probe, Kafka's tools, a Streams app and a Connect source connector,
#           tests/java/target (see tests/java/pom.xml)
#   franz-go  the franz-go driver of the compatibility tests (tests/compat/go/install.sh)
#   kafkajs   kafkajs and its codecs from npm (tests/compat/node/install.sh)
#   spark-kafka  Spark's Kafka source jars from Maven Central into tests/compat/spark/target/jars
#                (tests/compat/spark/install.sh)
#   kube    kube-apiserver, kube-controller-manager, kubectl and helm, built from the Go module
#           proxy into .tools/bin (tests/k8s/tools/install.sh)
# Usage: scripts/install-deps.sh [STEP...]   (default: every step, in the order above)
# Idempotent: each step checks a stamp or the installed state first and is a no-op when current,
# so a rerun takes seconds. Safe under `set -euo pipefail`, CI=true and no stdin. Runs are
# serialised by a lock file, so two concurrent callers do not build the same thing twice.
# One line per step on stdout; a failing step prints the tail of its log and exits non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
LOGS="$TOOLS/logs"

# chromium: the console's browser tests (tests/harness/browser.py). With no recommends it comes
# without fonts beyond fontconfig's default: Liberation (metric-compatible with Arial, Times and
# Courier, which pages' font stacks name) and DejaVu render the console and its screenshots.
APT_PACKAGES=(etcd-server etcd-client kcat chromium fonts-liberation fonts-dejavu-core)

# The exact module version `go install github.com/minio/minio@latest` resolved when this was
# pinned (built with go1.26.8). Bump deliberately: the build takes ~5 minutes on 2 cores cold.
MINIO_MODULE="github.com/minio/minio"
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"
MINIO_BIN="$TOOLS/bin/minio"
# A binary someone already built (e.g. by hand) is copied instead of rebuilt when its embedded
# module version is the pinned one. Set KAFSCALE_MINIO_PREBUILT= (empty) to always build.
MINIO_PREBUILT="${KAFSCALE_MINIO_PREBUILT-/tmp/gobuild/bin/minio}"

VENV="$ROOT/.venv"
JAVA_DIR="$ROOT/tests/java"

export DEBIAN_FRONTEND=noninteractive
# Go's official install location, in case a non-login shell's PATH lacks it.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH="/usr/local/go/bin:$PATH"
fi

mkdir -p "$TOOLS/bin" "$LOGS"

step_started=0
step() { step_started=$(date +%s%N); }
say() { # say STEP MESSAGE: one line per step, with its duration
    local ms=$((($(date +%s%N) - step_started) / 1000000))
    printf '[install-deps] %-7s %s (%d.%01ds)\n' "$1" "$2" $((ms / 1000)) $((ms % 1000 / 100))
}
die() { # die STEP MESSAGE [LOG]: the reason, the tail of the step's log, exit 1
    printf '[install-deps] %-7s FAILED: %s\n' "$1" "$2" >&2
    if [[ -n "${3:-}" && -f "$3" ]]; then
        printf -- '--- last lines of %s ---\n' "$3" >&2
        tail -n 40 "$3" >&2
    fi
    exit 1
}
sha_of_files() { # a digest of the named files' paths and contents, in sorted order
    LC_ALL=C sort | while IFS= read -r f; do printf '%s\n' "$f"; cat "$f"; done | sha256sum |
        cut -d' ' -f1
}

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then SUDO=(sudo -n); fi
fi

exec 9>"$TOOLS/install.lock"
flock 9

# --- apt -----------------------------------------------------------------------------------
apt_installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }

install_apt() {
    step
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do apt_installed "$p" || missing+=("$p"); done
    command -v java >/dev/null && command -v javac >/dev/null ||
        missing+=(openjdk-17-jdk-headless)
    command -v mvn >/dev/null || missing+=(maven)
    if [[ ${#missing[@]} -eq 0 ]]; then
        say apt "${APT_PACKAGES[*]} already installed"
        return
    fi
    local log="$LOGS/apt.log" policy=/usr/sbin/policy-rc.d made_policy=0
    # Package scripts must not start an etcd service (it would sit on :2379): policy-rc.d
    # exit 101 tells invoke-rc.d "not allowed". Only ours is removed afterwards.
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
        "${SUDO[@]}" chmod 755 "$policy"
        made_policy=1
    fi
    local apt=("${SUDO[@]}" apt-get -q -y -o DPkg::Lock::Timeout=300)
    if ! { "${apt[@]}" update && "${apt[@]}" install --no-install-recommends "${missing[@]}"; } \
        </dev/null >"$log" 2>&1; then
        [[ $made_policy -eq 0 ]] || "${SUDO[@]}" rm -f "$policy"
        die apt "apt-get install ${missing[*]}" "$log"
    fi
    [[ $made_policy -eq 0 ]] || "${SUDO[@]}" rm -f "$policy"
    # Belt and braces for a machine whose policy allowed the start: stop the service the
    # package just started (we installed it, so it is ours to stop); tests run their own etcd.
    if [[ -x /etc/init.d/etcd && -f /var/run/etcd.pid ]]; then
        "${SUDO[@]}" /etc/init.d/etcd stop >>"$log" 2>&1 || true
    fi
    say apt "installed ${missing[*]}"
}

# --- minio ---------------------------------------------------------------------------------
minio_version_of() { # the github.com/minio/minio module version embedded in a Go binary
    go version -m "$1" 2>/dev/null | awk -v m="$MINIO_MODULE" '$1 == "mod" && $2 == m { print $3 }'
}

install_minio() {
    step
    local stamp="$MINIO_BIN.version" want="$MINIO_MODULE@$MINIO_VERSION"
    if [[ -x $MINIO_BIN && -f $stamp && $(<"$stamp") == "$want" ]]; then
        say minio "$want already installed"
        return
    fi
    command -v go >/dev/null || die minio "go is not on PATH (needed to build $want)"
    local log="$LOGS/minio-build.log" staging="$TOOLS/minio-staging" how
    rm -rf "$staging"
    mkdir -p "$staging"
    if [[ -x $MINIO_BIN && $(minio_version_of "$MINIO_BIN") == "$MINIO_VERSION" ]]; then
        how="found at $MINIO_BIN"
    elif [[ -n $MINIO_PREBUILT && -x $MINIO_PREBUILT &&
        $(minio_version_of "$MINIO_PREBUILT") == "$MINIO_VERSION" ]]; then
        cp "$MINIO_PREBUILT" "$staging/minio"
        how="copied from $MINIO_PREBUILT"
    else
        # Go's default module and build caches are reused: a rebuild with warm caches is a link.
        if ! GOBIN="$staging" go install "$want" </dev/null >"$log" 2>&1; then
            die minio "go install $want" "$log"
        fi
        how="built with $(go env GOVERSION)"
    fi
    if [[ -f $staging/minio ]]; then
        [[ $(minio_version_of "$staging/minio") == "$MINIO_VERSION" ]] ||
            die minio "the binary in $staging is not $want" "$log"
        mv -f "$staging/minio" "$MINIO_BIN"
    fi
    rm -rf "$staging"
    printf '%s\n' "$want" >"$stamp"
    say minio "$want $how"
}

# --- python --------------------------------------------------------------------------------
# Three ways to fill .venv: `python` installs everything the tests need (the broker, the
# operator, the console and the test and Spark extras); `broker` only the broker, for
# scripts/serve.sh (a newcomer's first broker does not wait for pyspark); `console` the broker
# and the console's extra, for scripts/console.sh. A venv whose extras include the wanted ones
# serves (the stamp records them).
FULL_EXTRAS="test,spark,operator,console"

covers() { # covers HAVE WANT: every extra of the comma list WANT is in the comma list HAVE
    local want extra
    IFS=, read -ra want <<<"$2"
    for extra in "${want[@]}"; do
        [[ ",$1," == *",$extra,"* ]] || return 1
    done
}

install_python() { # install_python STEP EXTRAS
    local name=$1 extras=$2
    step
    local log="$LOGS/pip.log" python
    if [[ ! -x $VENV/bin/python ]]; then
        python="$(command -v python3.11 || command -v python3)" ||
            die "$name" "no python3.11 or python3 on PATH"
        "$python" -m venv "$VENV" >"$log" 2>&1 || die "$name" "$python -m venv $VENV" "$log"
    fi
    # Re-run pip only when the declared dependencies (or the interpreter) changed: the package
    # is installed editable, so source edits need no reinstall. The stamp is "<key> <extras>".
    local stamp="$VENV/.kafscale-install-stamp" key have_key="" have_extras=""
    key="$(
        { "$VENV/bin/python" -VV; sha256sum "$ROOT/pyproject.toml"; } | sha256sum | cut -d' ' -f1
    )"
    if [[ -f $stamp ]]; then read -r have_key have_extras <"$stamp" || true; fi
    if [[ $have_key == "$key" ]] && covers "$have_extras" "$extras"; then
        say "$name" "$VENV up to date"
        return
    fi
    local spec="."
    [[ -z $extras ]] || spec=".[$extras]"
    if ! (cd "$ROOT" && "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        --no-input -e "$spec") </dev/null >"$log" 2>&1; then
        die "$name" "pip install -e '$spec'" "$log"
    fi
    printf '%s %s\n' "$key" "$extras" >"$stamp"
    say "$name" "installed -e '$spec' into $VENV"
}

# --- java ----------------------------------------------------------------------------------
install_java() {
    step
    local target="$JAVA_DIR/target" stamp="$JAVA_DIR/target/.build-stamp" key
    key="$(
        {
            java -version 2>&1
            find "$JAVA_DIR" -path "$target" -prune -o -type f \
                \( -name pom.xml -o -path '*/src/*' \) -print | sha_of_files
        } | sha256sum | cut -d' ' -f1
    )"
    # The key covers every module's pom.xml (a new or changed module rebuilds) and the probe's
    # and the Streams and Connect test code's sources; the directories are checked too, in case
    # one was removed by hand.
    local dir built=1
    for dir in probe/classes lib-3.9 lib-4 tools-4 streams-4/classes lib-streams-4 \
        connect-4/classes; do
        [[ -d $target/$dir ]] || built=0
    done
    if [[ -f $stamp && $(<"$stamp") == "$key" && $built -eq 1 ]]; then
        say java "probe and tools up to date in $target"
        return
    fi
    local log="$LOGS/mvn.log"
    # A clean build, so a bumped kafka-clients version cannot leave the old jar in lib-X.
    rm -rf "$target"
    if ! mvn -q -B -Dstyle.color=never -f "$JAVA_DIR/pom.xml" package </dev/null >"$log" 2>&1; then
        die java "mvn package in $JAVA_DIR" "$log"
    fi
    printf '%s\n' "$key" >"$stamp"
    say java "built the probe, tools, Streams app and Connect source, $(cd "$target" &&
        echo lib-3.9/kafka-clients-*.jar lib-4/kafka-clients-*.jar tools-4/kafka-tools-[0-9]*.jar \
            lib-streams-4/kafka-streams-*.jar)"
}

# --- compatibility drivers (each step's script prints its own line) -------------------------
install_franz_go() { bash "$ROOT/tests/compat/go/install.sh"; }
install_kafkajs() { bash "$ROOT/tests/compat/node/install.sh"; }
install_spark_kafka() { bash "$ROOT/tests/compat/spark/install.sh"; }
install_kube() { bash "$ROOT/tests/k8s/tools/install.sh"; }

# With arguments, only the named steps run (scripts/serve.sh needs just `broker`).
ALL_STEPS=(apt minio python java franz-go kafkajs spark-kafka kube)
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=("${ALL_STEPS[@]}")
# The kube step is a long CPU-bound Go build (minutes, cold) and the Python, Java and npm steps
# mostly wait on downloads: with other steps to run, it starts first in the background (after
# apt, which installs the compilers' prerequisites) and is waited for at the end.
kube_pid=""
kube_log="$LOGS/kube-step.out"
if [[ ${#steps[@]} -gt 1 && " ${steps[*]} " == *" kube "* ]]; then
    [[ " ${steps[*]} " != *" apt "* ]] || install_apt
    install_kube >"$kube_log" 2>&1 &
    kube_pid=$!
    # A step that fails stops this script: the build stops with it.
    trap '[[ -z $kube_pid ]] || kill "$kube_pid" 2>/dev/null || true' EXIT
fi
for name in "${steps[@]}"; do
    if [[ -n $kube_pid && ($name == kube || $name == apt) ]]; then
        continue
    fi
    case $name in
        apt | minio | java) "install_$name" ;;
        python) install_python python "$FULL_EXTRAS" ;;
        broker) install_python broker "" ;;
        console) install_python console console ;;
        franz-go) install_franz_go ;;
        kafkajs) install_kafkajs ;;
        spark-kafka) install_spark_kafka ;;
        kube) install_kube ;;
        *) die "$name" "unknown step (known: ${ALL_STEPS[*]} broker console)" ;;
    esac
done
if [[ -n $kube_pid ]]; then
    status=0
    wait "$kube_pid" || status=$?
    kube_pid=""
    if [[ $status -ne 0 ]]; then
        cat "$kube_log" >&2
        exit 1
    fi
    cat "$kube_log"
fi
