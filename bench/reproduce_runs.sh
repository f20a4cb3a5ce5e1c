#!/usr/bin/env bash
# reproduce_runs.sh N [STORE]: build the stack, then `reproduce` its build hash N times in a row,
# each on a fresh empty store (reproduce's own), and print one line per run and a summary.
# The proof of bit-for-bit reproducibility: every run must say "reproduced".
#   bash bench/reproduce_runs.sh 10 ~/.cache/qwen38build/store
set -euo pipefail
n=${1:-10}
store=${2:-${QWEN38BUILD_STORE:-$HOME/.cache/qwen38build/store}}
q38=(python -m qwen38build --store "$store")
hash=$("${q38[@]}" build -q --no-link --json | python -c 'import json,sys; print(json.load(sys.stdin)["build"])')
echo "build $hash ($(date -u +%FT%TZ), $(nproc) cores)"
ok=0
for i in $(seq 1 "$n"); do
  t0=$(date +%s)
  # stdout is the verdict ("reproduced HASH", or NOT and each differing file); progress
  # goes to stderr
  if out=$("${q38[@]}" reproduce "$hash" 2>/dev/null); then ok=$((ok + 1)); fi
  echo "run $i ($(( $(date +%s) - t0 )) s): $out"
done
echo "reproduced $ok of $n"
[ "$ok" = "$n" ]
