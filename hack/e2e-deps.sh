#!/usr/bin/env bash
# Installs everything the end-to-end tier needs on a bare Debian 12 machine, and builds
# real CRI-O 1.34.0 (and crictl) and containerd 2.2.9 once into a cache outside the
# repository.
#
#   hack/e2e-deps.sh            install packages, build what is missing, print the cache dir
#   hack/e2e-deps.sh cri-o      only what a CRI-O node needs (make demo): CRI-O, crictl
#   hack/e2e-deps.sh containerd only what a containerd node needs (make demo RUNTIME=containerd)
#
# IMAGEPIN_CACHE (default /var/cache/imagepin) holds the binaries between runs.
set -euo pipefail

CACHE=${IMAGEPIN_CACHE:-/var/cache/imagepin}
CRIO_VERSION=v1.34.0
CRICTL_VERSION=v1.34.0
CONTAINERD_VERSION=v2.2.9
BIN="$CACHE/bin"
mkdir -p "$BIN"

log() { echo "e2e-deps: $*" >&2; }

WHAT=${1:-all}
case "$WHAT" in
  all) pkgs="docker-registry skopeo conmon runc containernetworking-plugins iproute2 dbus systemd chromium" ;;
  cri-o|containerd) pkgs="docker-registry skopeo conmon runc containernetworking-plugins iproute2" ;;
  *) log "usage: $0 [all|cri-o|containerd]"; exit 2 ;;
esac
want() { [ "$WHAT" = all ] || [ "$WHAT" = "$1" ]; }

need_pkgs=()
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's docker-registry package starts its service (on :5000) when installed; the
  # tests run their own registries. A policy-rc.d that refuses service starts keeps the
  # package from starting anything, so nothing has to be stopped afterwards, and no
  # registry of anyone else is touched. (Only a policy this script wrote is removed.)
  policy=/usr/sbin/policy-rc.d
  wrote_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# written by imagepin hack/e2e-deps.sh during apt-get install\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
    wrote_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null || { [ -z "$wrote_policy" ] || rm -f "$policy"; exit 1; }
  [ -z "$wrote_policy" ] || rm -f "$policy"
  # The service this install added is not to start at boot either (only when this run
  # installed the package: an administrator's own registry service is left alone).
  if printf '%s\n' "${need_pkgs[@]}" | grep -qx docker-registry; then
    systemctl disable docker-registry >/dev/null 2>&1 || true
  fi
fi

. "$(dirname "$0")/lib.sh"

if want cri-o && { [ ! -x "$BIN/crio" ] || [ ! -x "$BIN/pinns" ] || ! "$BIN/crio" version 2>/dev/null | grep -q "${CRIO_VERSION#v}"; }; then
  log "building CRI-O $CRIO_VERSION into $BIN (about 5 minutes cold)"
  work=$(mktemp -d "$CACHE/crio-src.XXXXXX")
  go_module_src github.com/cri-o/cri-o "$CRIO_VERSION" "$work/cri-o"
  (cd "$work/cri-o" && go mod download && \
   CGO_ENABLED=1 go build -trimpath \
     -tags "containers_image_openpgp containers_image_ostree_stub exclude_graphdriver_btrfs exclude_graphdriver_devicemapper" \
     -ldflags "-X github.com/cri-o/cri-o/internal/version.version=${CRIO_VERSION#v}" \
     -o "$BIN/crio.new" ./cmd/crio && \
   make -s -C pinns >/dev/null && cp bin/pinns "$BIN/pinns.new")
  mv "$BIN/crio.new" "$BIN/crio"; mv "$BIN/pinns.new" "$BIN/pinns"
  rm -rf "$work"
fi

if [ ! -x "$BIN/crictl" ]; then  # the demo shows what CRI-O and containerd hold with it
  log "building crictl $CRICTL_VERSION"
  work=$(mktemp -d "$CACHE/crictl-src.XXXXXX")
  GONOSUMDB=sigs.k8s.io/cri-tools go_module_src sigs.k8s.io/cri-tools "$CRICTL_VERSION" "$work/cri-tools"
  (cd "$work/cri-tools" && GONOSUMDB=sigs.k8s.io/cri-tools go build -trimpath -o "$BIN/crictl.new" ./cmd/crictl)
  mv "$BIN/crictl.new" "$BIN/crictl"
  rm -rf "$work"
fi

# containerd 2.x: its module has no replace directives. Static (no cgo), without the
# btrfs, devmapper and zfs snapshotters the tests do not use. About 1 minute cold.
# The runc shim (beside containerd, where containerd finds it) runs the pods of the
# pod-start test; it is built with containerd, from the same source.
if want containerd && { [ ! -x "$BIN/containerd" ] || [ ! -x "$BIN/containerd-shim-runc-v2" ] || ! "$BIN/containerd" --version 2>/dev/null | grep -q " $CONTAINERD_VERSION\b"; }; then
  log "building containerd $CONTAINERD_VERSION and its runc shim into $BIN"
  work=$(mktemp -d "$CACHE/containerd-src.XXXXXX")
  go_module_src github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" "$work/containerd"
  (cd "$work/containerd" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
     -ldflags "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
     -o "$BIN/containerd.new" ./cmd/containerd &&
   GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$BIN/containerd-shim-runc-v2.new" ./cmd/containerd-shim-runc-v2)
  mv "$BIN/containerd.new" "$BIN/containerd"
  mv "$BIN/containerd-shim-runc-v2.new" "$BIN/containerd-shim-runc-v2"
  rm -rf "$work"
fi

echo "$BIN"
