# Shared by hack/e2e-deps.sh and hack/kube-deps.sh (sourced).

# go_module_src MODULE VERSION DIR: copy a module's source out of the module cache into DIR,
# writable. Downloaded outside any module: the project's own go.mod must not matter.
go_module_src() {
  local mod=$1 ver=$2 dst=$3
  local dir
  dir=$(cd / && GOFLAGS= go mod download -json "$mod@$ver" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
  [ -n "$dir" ] || { log "cannot download $mod@$ver"; exit 1; }
  rm -rf "$dst"; cp -r "$dir" "$dst"; chmod -R u+w "$dst"
}
