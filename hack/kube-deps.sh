#!/usr/bin/env bash
# Builds the real Kubernetes control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl), its kubelet (KUBE_VERSION, default v1.36.3; v1.35.4 for make
# test-versions) and etcd (v3.6.6) once into the cache, from the Go module proxy, for the
# cluster-loop, kubelet and multi-node cluster end-to-end tests. Every Kubernetes binary is
# of one version, so no version skew is ever exercised.
#
#   hack/kube-deps.sh        build what is missing, print the cache's bin dir
#
# k8s.io/kubernetes's module zip holds neither staging/ nor vendor/, and its go.mod
# replaces the staging modules with ./staging/src/...: each is pointed at the published
# v0.MINOR.PATCH module instead (v0.36.3 for v1.36.3). etcd's server module replaces its
# siblings with ../: each is pointed at v3.6.6. One build at a time (2 cores): the five
# Kubernetes binaries of v1.36.3 took 9 minutes here (Go's build cache holding v1.35.4's
# shared dependencies; v1.35.4 took about 15 from an empty one), etcd about 3.
set -euo pipefail

CACHE=${IMAGEPIN_CACHE:-/var/cache/imagepin}
KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
ETCD_VERSION=v3.6.6
BIN="$CACHE/bin"
mkdir -p "$BIN"

log() { echo "kube-deps: $*" >&2; }

. "$(dirname "$0")/lib.sh"

# has_version BINARY VERSION: kubectl tells its version with `version --client`, the rest with --version.
has_version() {
  [ -x "$1" ] || return 1
  if [ "$(basename "$1")" = kubectl ]; then "$1" version --client 2>/dev/null | grep -q "$2"
  else "$1" --version 2>/dev/null | grep -q "$2"; fi
}

# build_kube VERSION BINARY...: builds k8s.io/kubernetes's commands at VERSION, each
# staging module pointed at its published v0.MINOR.PATCH.
build_kube() {
  local version=$1; shift
  local staging="v0.${version#v1.}" minor
  minor=$(echo "$version" | cut -d. -f2)
  local missing=()
  for b in "$@"; do has_version "$BIN/$b" "$version" || missing+=("$b"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  log "building ${missing[*]} $version into $BIN (about 8 minutes cold each)"
  local work
  work=$(mktemp -d "$CACHE/kube-src.XXXXXX")
  go_module_src k8s.io/kubernetes "$version" "$work/kubernetes"
  (
    cd "$work/kubernetes"
    rm -f go.work go.work.sum
    args=()
    while read -r mod; do
      args+=("-dropreplace=$mod" "-replace=$mod=$mod@$staging")
    done < <(sed -n 's|^\s*\(k8s.io/[^ ]*\) => ./staging/.*|\1|p' go.mod)
    go mod edit "${args[@]}"
    # One go build for all: a binary links while the next one's packages compile.
    pkgs=()
    for b in "${missing[@]}"; do pkgs+=("./cmd/$b"); done
    mkdir -p "$work/out"
    GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
      -ldflags "-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
      -o "$work/out/" "${pkgs[@]}"
    for b in "${missing[@]}"; do mv "$work/out/$b" "$BIN/$b"; done
  )
  rm -rf "$work"
}

# One k8s.io/kubernetes source tree and one Go build cache for all five: the packages they share
# compile once. Image pull credential verification (KEP-2535) is on by default from 1.35; 1.36
# names images differently in it (kubelet/credentials.go).
build_kube "$KUBE_VERSION" kubelet kube-apiserver kube-controller-manager kube-scheduler kubectl

if ! has_version "$BIN/etcd" "${ETCD_VERSION#v}"; then
  log "building etcd $ETCD_VERSION into $BIN (a few minutes cold)"
  work=$(mktemp -d "$CACHE/etcd-src.XXXXXX")
  go_module_src go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$work/etcd"
  (
    cd "$work/etcd"
    args=()
    while read -r mod; do
      args+=("-dropreplace=$mod" "-replace=$mod=$mod@$ETCD_VERSION")
    done < <(sed -n 's|^\s*\(go.etcd.io/[^ ]*\) => \.\./.*|\1|p' go.mod)
    [ ${#args[@]} -eq 0 ] || go mod edit "${args[@]}"
    GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$BIN/etcd.new" .
  )
  mv "$BIN/etcd.new" "$BIN/etcd"
  rm -rf "$work"
fi

echo "$BIN"
