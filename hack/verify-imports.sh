#!/usr/bin/env bash
# The house rules the compiler does not check:
# - no command links test support (fakes, test registries, test certificates, conformance
#   suites): packages named *test or fake* are for tests only;
# - the node daemon links nothing under cluster/ (the aggregator side: the server, its status
#   writer, the leader election of its replicas, the read side's authentication), and the agent
#   no runtime (it speaks pin.Pinner).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mod=github.com/imagepin/imagepin
bad=0
for cmd in ./cmd/imagepind ./cmd/imagepinctl ./cmd/imagepin-aggregator; do
  if out=$($GO list -deps "$cmd" | grep -E "^$mod/.*(test|/fake[a-z]*)(/|$)"); then
    echo "$cmd links test support:"; echo "$out"; bad=1
  fi
done
if out=$($GO list -deps ./cmd/imagepind | grep -E "^$mod/cluster(/|$)"); then
  echo "imagepind links the aggregator side:"; echo "$out"; bad=1
fi
if out=$($GO list -f '{{join .Imports "\n"}}' ./agent | grep -E "^$mod/(crio|containerd)$"); then
  echo "the agent imports a runtime package (use pin.Pinner):"; echo "$out"; bad=1
fi
[ "$bad" -eq 0 ] || exit 1
echo "imports: no command links test support; imagepind links nothing under cluster/; the agent imports no runtime"
