#!/usr/bin/env bash
# make rpm: builds imagepin RPMs for x86_64 and aarch64 from cross-compiled static
# binaries with Debian's rpmbuild (installed here if missing). Output: _output/rpm/RPMS/.
set -euo pipefail
cd "$(dirname "$0")/.."
# rpmbuild, and what hack/rpm-test.sh reads the packages with.
if ! command -v rpmbuild >/dev/null || ! command -v cpio >/dev/null || ! command -v file >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends rpm cpio file >/dev/null
fi
version=${VERSION:-0.1.0}
version=${version#v}
release=1
case $version in
  [0-9]*) version=${version//-/_} ;;               # rpm versions have no dashes
  *) release="0.git${version//-/_}"; version=0.1.0 ;; # untagged: a pre-release of 0.1.0, by commit
esac
top=$PWD/_output/rpm
rm -rf "$top"; mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS,BUILDROOT}
for pair in x86_64:amd64 aarch64:arm64; do
  rpmarch=${pair%%:*}; goarch=${pair##*:}
  src="$top/SOURCES/$goarch"; mkdir -p "$src"
  CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$src/" ./cmd/imagepind ./cmd/imagepinctl
  cp packaging/systemd/imagepind.service packaging/systemd/80-imagepin.preset packaging/config/imagepind.toml README.md docs/configuration.md docs/operations.md "$src/"
  rpmbuild -bb --quiet --target "$rpmarch" \
    --define "_topdir $top" --define "_sourcedir $src" --define "_goarch $goarch" --define "_version $version" --define "_release $release" \
    --define "_build_id_links none" \
    packaging/rpm/imagepin.spec
done
find "$top/RPMS" -name '*.rpm' | sort
