#!/usr/bin/env bash
# Builds helm (v3.22.0) once into the cache, from the Go module proxy, for the end-to-end
# test that installs, upgrades and uninstalls the chart (packaging/helm/imagepin) on the
# multi-node cluster.
#
#   hack/helm-deps.sh        build it if missing, print the cache's bin dir
#
# helm.sh/helm/v3 has no replace directives: its module source builds as it is. About
# 3 minutes cold on 2 cores.
set -euo pipefail

CACHE=${IMAGEPIN_CACHE:-/var/cache/imagepin}
HELM_VERSION=v3.22.0
BIN="$CACHE/bin"
mkdir -p "$BIN"

log() { echo "helm-deps: $*" >&2; }

. "$(dirname "$0")/lib.sh"

if ! { [ -x "$BIN/helm" ] && "$BIN/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; }; then
  log "building helm $HELM_VERSION into $BIN (about 3 minutes cold)"
  work=$(mktemp -d "$CACHE/helm-src.XXXXXX")
  go_module_src helm.sh/helm/v3 "$HELM_VERSION" "$work/helm"
  (
    cd "$work/helm"
    GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
      -ldflags "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
      -o "$BIN/helm.new" ./cmd/helm
  )
  mv "$BIN/helm.new" "$BIN/helm"
  rm -rf "$work"
fi

echo "$BIN"
