#!/usr/bin/env bash
# Checks the RPMs make rpm built: architecture, files and modes, config(noreplace), static
# binaries of the right machine, the unit and config identical to the repository's,
# dependencies, and the scriptlets, run with a stub systemctl for install, upgrade, erase.
# Prints "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()   { pass=$((pass+1)); }
bad()  { fail=$((fail+1)); echo "FAIL: $*"; }
check() { if eval "$2"; then ok; else bad "$1"; fi; }

for pair in x86_64:x86-64 aarch64:"ARM aarch64"; do
  arch=${pair%%:*}; machine=${pair#*:}
  rpm=$(ls _output/rpm/RPMS/$arch/imagepin-*.rpm 2>/dev/null | head -1)
  [ -n "$rpm" ] || { bad "$arch: no RPM (run make rpm)"; continue; }
  q() { rpm -qp --nosignature "$@" "$rpm" 2>/dev/null; }
  check "$arch: ARCH" '[ "$(q --qf "%{ARCH}")" = "$arch" ]'
  files=$(q --qf '[%{FILEMODES:perms} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILENAMES}\n]')
  for want in "-rwxr-xr-x root root /usr/bin/imagepind" "-rwxr-xr-x root root /usr/bin/imagepinctl" \
              "-rw-r--r-- root root /usr/lib/systemd/system/imagepind.service" \
              "-rw-r--r-- root root /usr/lib/systemd/system-preset/80-imagepin.preset" \
              "-rw-r--r-- root root /etc/imagepin/imagepind.toml" "drwxr-xr-x root root /etc/imagepin/sets.d" \
              "drwx------ root root /var/lib/imagepin"; do
    check "$arch: file $want" 'grep -qxF -- "$want" <<<"$files"'
  done
  check "$arch: config(noreplace)" '[ "$(q --qf "[%{FILEFLAGS:fflags} %{FILENAMES}\n]" | grep " /etc/imagepin/imagepind.toml$" | cut -d" " -f1)" = "cn" ]'
  reqs=$(q --requires)
  check "$arch: requires systemd" 'grep -qx "systemd" <<<"$reqs"'
  check "$arch: requires cri-o >= 1.28" 'grep -qx "cri-o >= 1.28" <<<"$reqs"'
  x=$(mktemp -d); (cd "$x" && rpm2cpio "$OLDPWD/$rpm" | cpio -idm --quiet)
  for bin in imagepind imagepinctl; do
    desc=$(file -b "$x/usr/bin/$bin")
    check "$arch: $bin is $machine" 'grep -q -- "$machine" <<<"$desc"'
    check "$arch: $bin is static" 'grep -qE "statically linked|static-pie" <<<"$desc"'
  done
  check "$arch: the unit is the repository's" 'cmp -s "$x/usr/lib/systemd/system/imagepind.service" packaging/systemd/imagepind.service'
  check "$arch: the config is the repository's" 'cmp -s "$x/etc/imagepin/imagepind.toml" packaging/config/imagepind.toml'
  rm -rf "$x"

  # The scriptlets, run as rpm would ($1 = instances after the operation) with a stub
  # systemctl that records its calls. systemd is not PID 1 here, as during rpm-ostree
  # layering: nothing is started, the preset still enables.
  stub=$(mktemp -d); log=$stub/calls
  printf '#!/bin/sh\necho "$*" >> %s\n' "$log" > "$stub/systemctl"; chmod +x "$stub/systemctl"
  run() { : > "$log"; PATH="$stub:$PATH" sh -c "$(q --qf "%{$1}")" scriptlet "$2"; cat "$log"; }
  check "$arch: install: preset"            '[ "$(run POSTIN 1)" = "--no-reload preset imagepind.service" ]'
  check "$arch: upgrade: no preset"         '[ -z "$(run POSTIN 2)" ]'
  check "$arch: upgrade: try-restart"       '[ "$(run POSTUN 1)" = "try-restart imagepind.service" ]'
  check "$arch: upgrade: not stopped"       '[ -z "$(run PREUN 1)" ]'
  check "$arch: erase: disable --now"       '[ "$(run PREUN 0)" = "--no-reload disable --now imagepind.service" ]'
  check "$arch: erase: no restart"          '[ -z "$(run POSTUN 0)" ]'
  # A failing systemctl never fails the transaction.
  printf '#!/bin/sh\nexit 1\n' > "$stub/systemctl"
  check "$arch: scriptlets tolerate a failing systemctl" 'PATH="$stub:$PATH" sh -c "$(q --qf "%{POSTIN}")" s 1 && PATH="$stub:$PATH" sh -c "$(q --qf "%{PREUN}")" s 0 && PATH="$stub:$PATH" sh -c "$(q --qf "%{POSTUN}")" s 1'
  rm -rf "$stub"
done
echo "rpm: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
