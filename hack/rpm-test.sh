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
  check "$arch: requires cri-o >= 1.28 or containerd >= 1.7" 'grep -qx "(cri-o >= 1.28 or containerd >= 1.7 or containerd.io >= 1.7)" <<<"$reqs"'
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

# RHEL, Fedora and CentOS builders define the %systemd_* macros, and rpmbuild expands
# macros inside comments too: an unescaped %systemd_post in a scriptlet comment would leave
# the first line of its expansion commented and the rest live shell. Build once more with
# such macros loaded (multi-line, as systemd-rpm-macros has them) and require the very same
# scriptlets; a copy of the spec with the comments unescaped must differ (the check can fail).
rpmmacros=$(mktemp)
cat > "$rpmmacros" <<'MACROS'
%systemd_post() \
if [ $1 -eq 1 ]; then \
    systemctl --no-reload preset %{?*} || : \
fi \
%{nil}
%systemd_preun() \
if [ $1 -eq 0 ]; then \
    systemctl --no-reload disable --now %{?*} || : \
fi \
%{nil}
%systemd_postun_with_restart() \
if [ $1 -ge 1 ]; then \
    systemctl try-restart %{?*} || : \
fi \
%{nil}
MACROS
scripts_built_with_macros() {
  local spec=$1 top
  top=$(mktemp -d); mkdir -p "$top"/{BUILD,RPMS,BUILDROOT,SRPMS}
  rpm_version=$(rpm -qp --nosignature --qf '%{VERSION}' "$base_rpm" 2>/dev/null)
  rpm_release=$(rpm -qp --nosignature --qf '%{RELEASE}' "$base_rpm" 2>/dev/null)
  # --macros, not --load: --target re-reads the macro path and would drop a --load.
  rpmbuild -bb --quiet --target x86_64 --macros="$(rpm --showrc | sed -n 's/^Macro path: //p'):$rpmmacros" \
    --define "_topdir $top" --define "_sourcedir $PWD/_output/rpm/SOURCES/amd64" --define "_goarch amd64" \
    --define "_version $rpm_version" --define "_release $rpm_release" --define "_build_id_links none" \
    "$spec" >/dev/null 2>&1 || { echo "rpmbuild with systemd macros failed"; rm -rf "$top"; return 1; }
  rpm -qp --nosignature --scripts "$(find "$top/RPMS" -name '*.rpm' | head -1)" 2>/dev/null
  rm -rf "$top"
}
base_rpm=$(ls _output/rpm/RPMS/x86_64/imagepin-*.rpm 2>/dev/null | head -1)
if [ -n "$base_rpm" ]; then
  plain=$(rpm -qp --nosignature --scripts "$base_rpm" 2>/dev/null)
  with=$(scripts_built_with_macros packaging/rpm/imagepin.spec)
  check "scriptlets unchanged when %systemd_* macros are defined (RHEL builders)" '[ -n "$with" ] && [ "$with" = "$plain" ]'
  unescaped=$(mktemp --suffix=.spec); sed 's/%%systemd_/%systemd_/g' packaging/rpm/imagepin.spec > "$unescaped"
  control=$(scripts_built_with_macros "$unescaped")
  check "control: unescaped macros in comments would change the scriptlets" '[ -n "$control" ] && [ "$control" != "$plain" ]'
  rm -f "$unescaped"
else
  bad "no x86_64 RPM for the macro check (run make rpm)"
fi
rm -f "$rpmmacros"
echo "rpm: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
