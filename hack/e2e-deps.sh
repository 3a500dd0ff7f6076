#!/usr/bin/env bash
# Installs everything the end-to-end tier needs on a bare Debian 12 machine, and builds
# real CRI-O (default 1.36.3; crictl 1.34.0) and containerd (default 2.4.2) once into a
# cache outside the repository.
#
#   hack/e2e-deps.sh            install packages, build what is missing, print the cache dir
#   hack/e2e-deps.sh cri-o      only what a CRI-O node needs (make demo): CRI-O, crictl
#   hack/e2e-deps.sh containerd only what a containerd node needs (make demo RUNTIME=containerd)
#
# IMAGEPIN_CACHE (default /var/cache/imagepin) holds the binaries between runs;
# CRIO_VERSION and CONTAINERD_VERSION (v1.34.0, v2.2.9: make test-versions) choose other
# versions, each kept in its own cache (a binary of another version is rebuilt).
set -euo pipefail

log() { echo "e2e-deps: $*" >&2; }

# root is "" on a machine; hack/e2e_deps_test.go sources this file (which then only
# defines the functions below) and sets it to a sandbox: where policy-rc.d, the init
# script and systemd's run directory are.
root=

# Debian's docker-registry package starts its service (on :5000) when installed; the tests
# run their own registries. While apt-get installs, a policy-rc.d that refuses every
# service start keeps the package from starting anything, so no registry of anyone else
# is touched. It is written only where there is none (created exclusively), says which
# run wrote it, and is removed when the install ends, fails or is interrupted (SIGINT,
# SIGTERM, SIGHUP: the trap; a signal to this script alone takes effect once apt-get
# returns, so the file stays while apt-get runs), and only while it still holds what
# this run wrote. A kill -9 cannot be trapped: the file then stays, its second line
# naming the script and the run; delete it by hand.
policy_file() { echo "$root/usr/sbin/policy-rc.d"; }
policy_text() { printf '#!/bin/sh\n# written by imagepin hack/e2e-deps.sh (pid %s) while apt-get installs; removed when it ends\nexit 101' "$$"; }
wrote_policy=

write_policy() {
  local policy text
  policy=$(policy_file)
  text=$(policy_text)
  # noclobber: bash opens the file with O_EXCL, so a file (or a dangling link) that is
  # there is never written through or over.
  if (set -C; printf '%s\n' "$text" > "$policy") 2>/dev/null; then
    wrote_policy=$text
    chmod 0755 "$policy"
  fi
}

remove_policy() {
  local policy
  policy=$(policy_file)
  if [ -n "$wrote_policy" ] && [ "$(cat "$policy" 2>/dev/null)" = "$wrote_policy" ]; then
    rm -f "$policy"
  fi
  wrote_policy=
}

# stop_installed_registry stops the docker-registry service this run's install started:
# through the package's own service (systemd's unit, else the package's init script,
# which stops the PID in its pidfile), never by process name. The package was not
# installed before this run, so no service of that name ran before it, and a registry
# anyone runs by hand is not touched. It starts only where a policy-rc.d was already
# there (not this run's) and allowed it.
stop_installed_registry() {
  if [ -d "$root/run/systemd/system" ]; then
    systemctl stop docker-registry.service >/dev/null 2>&1 || true
  elif [ -x "$root/etc/init.d/docker-registry" ]; then
    "$root/etc/init.d/docker-registry" stop >/dev/null 2>&1 || true
  fi
}

# install_packages PKG...: apt-get install, with no service started by it (above). The
# docker-registry service, when this run installed it, is not to start at boot either.
install_packages() {
  log "installing $*"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  trap remove_policy EXIT
  local sig
  for sig in INT TERM HUP; do
    # shellcheck disable=SC2064 # the signal's name now; then dies of it, as without the trap
    trap "remove_policy; trap - $sig EXIT; kill -$sig \$\$" "$sig"
  done
  write_policy
  local ours=$wrote_policy rc=0
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
  remove_policy
  trap - EXIT INT TERM HUP
  [ "$rc" -eq 0 ] || exit "$rc"
  if printf '%s\n' "$@" | grep -qx docker-registry; then
    [ -n "$ours" ] || stop_installed_registry
    systemctl disable docker-registry >/dev/null 2>&1 || true
  fi
}

# Sourced: the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

CACHE=${IMAGEPIN_CACHE:-/var/cache/imagepin}
CRIO_VERSION=${CRIO_VERSION:-v1.36.3}
CRICTL_VERSION=v1.34.0
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
BIN="$CACHE/bin"
mkdir -p "$BIN"

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
  install_packages "${need_pkgs[@]}"
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
