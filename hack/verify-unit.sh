#!/usr/bin/env bash
# systemd-analyze verify of the shipped unit, with the binary installed in a throwaway
# root that has the distribution's units (targets) and a crio.service.
set -euo pipefail
bin=${1:?usage: verify-unit.sh DIR-WITH-IMAGEPIND}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/etc/systemd/system" "$root/lib/systemd"
cp -r /lib/systemd/system "$root/lib/systemd/"
install -m 0755 "$bin/imagepind" "$root/usr/bin/imagepind"
# ExecReload runs /bin/kill (util-linux on RHEL, procps on Debian: on every node).
mkdir -p "$root/bin"
install -m 0755 "$(type -P kill)" "$root/bin/kill"
install -m 0644 packaging/systemd/imagepind.service "$root/etc/systemd/system/"
printf '[Unit]\nDescription=CRI-O stand-in\n[Service]\nType=notify\nExecStart=/usr/bin/imagepind\n' > "$root/etc/systemd/system/crio.service"
# A CRI-O node (crio.service only); the containerd node's root is checked below.
out=$(systemd-analyze --root="$root" verify "$root/etc/systemd/system/imagepind.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "systemd-analyze verify warned:"; echo "$out"; exit 1; fi
# A containerd node: no crio.service, no /etc/crio.
rm "$root/etc/systemd/system/crio.service"
printf '[Unit]\nDescription=containerd stand-in\n[Service]\nType=notify\nExecStart=/usr/bin/imagepind\n' > "$root/etc/systemd/system/containerd.service"
out=$(systemd-analyze --root="$root" verify "$root/etc/systemd/system/imagepind.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "systemd-analyze verify (containerd node) warned:"; echo "$out"; exit 1; fi
echo "systemd-analyze verify: packaging/systemd/imagepind.service clean (CRI-O node and containerd node)"
