#!/usr/bin/env bash
# Regenerates the gRPC/protobuf code from api/imagepinv1/*.proto (make proto). The
# generated files are committed; CI does not need protoc.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${IMAGEPIN_CACHE:-/var/cache/imagepin}
BIN="$CACHE/bin"
mkdir -p "$BIN"
if ! command -v protoc >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null
fi
# Plugin versions follow go.mod's protobuf and grpc.
pbver=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
if [ ! -x "$BIN/protoc-gen-go-$pbver" ]; then
  tmp=$(mktemp -d); GOBIN=$tmp go install "google.golang.org/protobuf/cmd/protoc-gen-go@$pbver"; mv "$tmp/protoc-gen-go" "$BIN/protoc-gen-go-$pbver"; rm -rf "$tmp"
fi
grpcver=v1.5.1
if [ ! -x "$BIN/protoc-gen-go-grpc-$grpcver" ]; then
  tmp=$(mktemp -d); GOBIN=$tmp go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$grpcver"; mv "$tmp/protoc-gen-go-grpc" "$BIN/protoc-gen-go-grpc-$grpcver"; rm -rf "$tmp"
fi
protoc -I api \
  --plugin=protoc-gen-go="$BIN/protoc-gen-go-$pbver" --go_out=. --go_opt=module=github.com/imagepin/imagepin \
  --plugin=protoc-gen-go-grpc="$BIN/protoc-gen-go-grpc-$grpcver" --go-grpc_out=. --go-grpc_opt=module=github.com/imagepin/imagepin \
  api/imagepinv1/report.proto
echo "generated api/imagepinv1 with protoc $(protoc --version | cut -d' ' -f2), protoc-gen-go $pbver, protoc-gen-go-grpc $grpcver"
