#!/usr/bin/env bash
# The house rules the compiler does not check (docs/architecture.md, "Rules the build checks"):
# 1. no command links test support (fakes, test registries, test certificates, conformance
#    suites): packages named *test or fake*, and everything under test/, are for tests only;
# 2. no package outside test/ imports anything under test/ in its non-test code;
# 3. internal/ holds the module's leaves: a package under internal/ (its tests included)
#    imports, of imagepin's own packages, only others under internal/ and leaves (packages
#    that import none of imagepin's), and in its tests test support under test/;
# 4. the models and the runtime port (status, pinset, pin), their tests included, import only
#    each other, api/, internal/ and test support: never a runtime or another part of the node;
# 5. the node daemon links nothing under cluster/ (the aggregator side: the server, its status
#    writer, the leader election of its replicas, the read side's authentication);
# 6. the aggregator links nothing of the node side: only cluster/, api/, internal/ and the
#    shared models status and pinset (a name both sides use lives in api/, such as the Node
#    condition's type, api/v1alpha1.NodeConditionPinnedImagesReady);
# 7. the agent imports no runtime (it speaks pin.Pinner).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mod=github.com/imagepin/imagepin
bad=0
# check MESSAGE OUT: a rule broken when OUT, the offending lines, is not empty.
check() {
  if [ -n "$2" ]; then
    echo "$1"; echo "$2" | sed 's/^/  /'; bad=1
  fi
}

# Each package of the module with its imports of the module's own packages:
# "path|code imports|test imports" (an external test's import of its own package left out).
graph=$($GO list -e -f '{{.ImportPath}}|{{join .Imports " "}}|{{join .TestImports " "}} {{join .XTestImports " "}}' ./... |
  awk -F'|' -v m="$mod/" '{
    out = $1 "|"
    n = split($2, a, " "); s = ""; for (i = 1; i <= n; i++) if (index(a[i], m) == 1) s = s " " a[i]
    out = out substr(s, 2) "|"
    n = split($3, a, " "); s = ""; for (i = 1; i <= n; i++) if (index(a[i], m) == 1 && a[i] != $1) s = s " " a[i]
    print out substr(s, 2)
  }')
# imports PKG-REGEX FIELD: "pkg: import" for each import (FIELD 2: code, 3: tests) of the
# packages matching PKG-REGEX.
imports() {
  echo "$graph" | awk -F'|' -v re="$1" -v f="$2" '$1 ~ re { n = split($f, a, " "); for (i = 1; i <= n; i++) print $1 ": " a[i] }'
}
# What each command links (not in a condition: a failing go list stops the script).
declare -A deps
for cmd in imagepind imagepinctl imagepin-aggregator; do
  deps[$cmd]=$($GO list -deps "./cmd/$cmd" | grep "^$mod/")
done

# 1
for cmd in imagepind imagepinctl imagepin-aggregator; do
  check "cmd/$cmd links test support:" "$(echo "${deps[$cmd]}" | grep -E "^$mod/.*(test|/fake[a-z]*)(/|$)" || true)"
done
# 2
check "a package outside test/ imports test support in its code:" \
  "$(imports "^" 2 | grep -v "^$mod/test/" | grep -E ": $mod/test/" || true)"
# 3
leaves=$(echo "$graph" | awk -F'|' '$2 == "" { print $1 }')
check "a package under internal/ imports imagepin beyond internal/ and the leaves:" \
  "$( { imports "^$mod/internal/" 2; imports "^$mod/internal/" 3 | grep -v ": $mod/test/" || true; } |
    awk -v leaves="$leaves" -v under="$mod/internal/" '
      BEGIN { n = split(leaves, l, "\n"); for (i = 1; i <= n; i++) leaf[l[i]] = 1 }
      { dep = substr($0, index($0, ": ") + 2) }
      index(dep, under) != 1 && !(dep in leaf)')"
# 4
models="^$mod/(status|pinset|pin)$"
check "a model or the runtime port (status, pinset, pin) imports a part of the node, tests included:" \
  "$( { imports "$models" 2; imports "$models" 3; } | grep -vE ": $mod/((api|internal|test)/.*|status|pinset|pin)$" || true)"
# 5
check "imagepind links the aggregator side:" "$(echo "${deps[imagepind]}" | grep -E "^$mod/cluster(/|$)" || true)"
# 6
check "the aggregator links the node side:" \
  "$(echo "${deps[imagepin-aggregator]}" | grep -vE "^$mod/((cluster|api|internal)/.*|status|pinset|cmd/imagepin-aggregator)$" || true)"
# 7
check "the agent imports a runtime package (use pin.Pinner):" "$(imports "^$mod/agent$" 2 | grep -E ": $mod/(crio|containerd)$" || true)"
[ "$bad" -eq 0 ] || exit 1
echo "imports: no command links test support, and only tests import it; internal/ imports only itself and leaves;" \
  "the models import no part of the node; imagepind links nothing under cluster/, the aggregator nothing of the node; the agent imports no runtime"
