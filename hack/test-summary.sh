#!/usr/bin/env bash
# Passes `go test -v` output through, keeping only test verdicts, failures and their
# logs, and fails when the run failed. CI's log stays readable; nothing is hidden that
# explains a failure.
set -o pipefail
status=0
while IFS= read -r line; do
  case "$line" in
    "=== RUN"*|"=== PAUSE"*|"=== CONT"*) ;;
    *) printf '%s\n' "$line" ;;
  esac
  case "$line" in
    FAIL*|"--- FAIL"*) status=1 ;;
  esac
done
exit $status
