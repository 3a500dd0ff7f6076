#!/usr/bin/env bash
# What `make bench` needs beyond the e2e tier: toxiproxy, to put the registry behind an
# emulated slow link (the kernel here has no netem).
set -euo pipefail
CACHE=${IMAGEPIN_CACHE:-/var/cache/imagepin}
"$(dirname "$0")/e2e-deps.sh" >/dev/null
if [ ! -x "$CACHE/bin/toxiproxy-server" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && GOBIN="$tmp" go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0)
  mv "$tmp/server" "$CACHE/bin/toxiproxy-server"
  rm -rf "$tmp"
fi
echo "$CACHE/bin"
