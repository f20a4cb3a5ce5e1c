#!/usr/bin/env bash
# Cold stack builds, steps one at a time and side by side: `build -j 1` against `-j N`, each
# from an empty store, alternating, twice. The fixed-output inputs (the vLLM wheel, the
# compiler wheels) come from SEED, a folder of them (no network); everything else is built:
# the patched wheel, the toolchain, the cubins of every arch, the pthfa wheel, the stack.
#   bash bench/stack_jobs.sh SEED [N] [OUTPUTS...]   (OUTPUTS: --only values; default all)
set -u
SEED=$1 N=${2:-$(nproc)}
shift; shift
only=(); for o in "$@"; do only+=(--only "$o"); done
cd "$(dirname "$0")/.."
for j in 1 "$N" 1 "$N"; do
  store=$(mktemp -d)
  s=$(date +%s.%N)
  QWEN38BUILD_SOURCES=$SEED python3 -m qwen38build --store "$store" build --no-link -q --json \
      -j "$j" "${only[@]}" > "$store.json"
  rc=$?
  e=$(date +%s.%N)
  build=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['build'][:12])" \
          "$store.json" 2>/dev/null)
  echo "build -j $j rc=$rc $(python3 -c "print(round($e - $s, 1))") s build=$build ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
  chmod -R u+w "$store" && rm -rf "$store" "$store.json"
done
