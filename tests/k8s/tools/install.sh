#!/usr/bin/env bash
# Builds the Kubernetes tools the operator's tests use into .tools/bin, from the Go module proxy:
#   kube-apiserver, kube-controller-manager, kubectl   k8s.io/kubernetes at go.mod's version
#   helm                                               helm.sh/helm/v3 at HELM_VERSION below
# (No container runtime runs here, so no kind or envtest: their binaries come from download sites
# that cannot be reached.) Idempotent: a stamp holds the inputs' digest and a rerun is a no-op.
# Cold, the build takes about 6 minutes on 2 cores; Go's module and build caches make a rebuild a
# link. Called by scripts/install-deps.sh (step kube); prints one line.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BIN="$ROOT/.tools/bin"
LOGS="$ROOT/.tools/logs"
HELM_VERSION="v3.22.0"
KUBE_TOOLS=(kube-apiserver kube-controller-manager kubectl)

mkdir -p "$BIN" "$LOGS"
started=$(date +%s%N)
say() {
    local ms=$((($(date +%s%N) - started) / 1000000))
    printf '[install-deps] %-7s %s (%d.%01ds)\n' kube "$1" $((ms / 1000)) $((ms % 1000 / 100))
}
die() {
    printf '[install-deps] %-7s FAILED: %s\n' kube "$1" >&2
    [[ -f ${2:-} ]] && { printf -- '--- last lines of %s ---\n' "$2" >&2; tail -n 40 "$2" >&2; }
    exit 1
}

if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null || die "go is not on PATH"

stamp="$BIN/.kube-tools-stamp"
key="$(
    {
        go env GOVERSION
        echo "helm $HELM_VERSION"
        cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/tools.go"
    } | sha256sum | cut -d' ' -f1
)"
have_all=1
for tool in "${KUBE_TOOLS[@]}" helm; do [[ -x $BIN/$tool ]] || have_all=0; done
if [[ $have_all -eq 1 && -f $stamp && $(<"$stamp") == "$key" ]]; then
    say "${KUBE_TOOLS[*]} helm already built"
    exit 0
fi

log="$LOGS/kube-build.log"
staging="$ROOT/.tools/kube-staging"
rm -rf "$staging"
mkdir -p "$staging"
version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$HERE/go.mod")"
packages=()
for tool in "${KUBE_TOOLS[@]}"; do packages+=("k8s.io/kubernetes/cmd/$tool"); done
# -mod=readonly: go.sum is committed; a build that needs to change it fails instead.
if ! (cd "$HERE" && go build -mod=readonly -trimpath -ldflags="-s -w" -o "$staging/" \
    "${packages[@]}") </dev/null >"$log" 2>&1; then
    die "go build ${packages[*]} ($version)" "$log"
fi
if ! GOBIN="$staging" go install -trimpath -ldflags="-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    </dev/null >>"$log" 2>&1; then
    die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$log"
fi
for tool in "${KUBE_TOOLS[@]}" helm; do mv -f "$staging/$tool" "$BIN/$tool"; done
rm -rf "$staging"
printf '%s\n' "$key" >"$stamp"
say "built ${KUBE_TOOLS[*]} $version and helm $HELM_VERSION with $(go env GOVERSION)"
