#!/usr/bin/env bash
# Cold kernel builds one arch at a time and side by side: `kernels -j 1` against `-j N`,
# each from an empty store, twice, with the system nvcc (no toolchain to fetch).
#   bash bench/kernels_jobs.sh [N]
# Prints each run's seconds and build hash (the same for every -j: the bytes do not depend
# on the order the steps ran in).
set -u
N=${1:-$(nproc)}
cd "$(dirname "$0")/.."
for j in 1 "$N" 1 "$N"; do
  store=$(mktemp -d)
  s=$(date +%s.%N)
  python3 -m qwen38build --store "$store" kernels --system-nvcc -j "$j" -q --json > "$store.json"
  rc=$?
  e=$(date +%s.%N)
  build=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['build'][:12])" \
          "$store.json" 2>/dev/null)
  echo "kernels -j $j rc=$rc $(python3 -c "print(round($e - $s, 1))") s build=$build"
  chmod -R u+w "$store" && rm -rf "$store" "$store.json"
done
