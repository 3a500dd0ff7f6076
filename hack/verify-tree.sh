#!/usr/bin/env bash
# Fails on a tracked binary (an ELF, or any file with a NUL byte in its first 8 KiB) or a
# tracked file over 1 MiB: build outputs and large data never go into the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f")
  if [ "$size" -gt 1048576 ]; then
    echo "tracked file over 1 MiB: $f ($size bytes)"; bad=1
  fi
  if head -c 8192 "$f" | grep -q -P '\x00' 2>/dev/null || head -c 4 "$f" | grep -q $'\x7fELF'; then
    echo "tracked binary: $f"; bad=1
  fi
done < <(git ls-files -z)
if [ "$bad" -ne 0 ]; then
  echo "remove them (git rm --cached FILE) and ignore build outputs in .gitignore"
  exit 1
fi
echo "tree: no tracked binary, no tracked file over 1 MiB"
