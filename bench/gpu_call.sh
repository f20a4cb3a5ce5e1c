#!/usr/bin/env bash
# One call on a GPU machine that has no package index and no vLLM wheel: the README's
# `./noxw -s gpu_tests` (nox and the tool installed from carried wheels; the vLLM trees from
# the carried result/vllm-py-trees.zip, which the session checks against the plan; pthfa's
# cubin and FA2's library built for the GPU present with its own nvcc, FA2's trees from the
# carried mirror), then the GPU series cuts of a pack. Everything goes into one archive,
# OUT/gpu-call.tgz, re-made after each stage (a call cut short still returns what it had).
#
#   bench/gpu_call.sh CARRIED OUT
#
# CARRIED holds wheels/ (nox, the tool's dependencies), sources/ (the FA2 and CUTLASS
# trees, as ../shared/sources names them) and cuts/ (bench/gpu_series_cuts.py pack);
# see README "GPU tests". SUITE_S and CUTS_S bound the two stages (seconds).
set -u
if [ $# -ne 2 ] || [ ! -d "$1/wheels" ] || [ ! -d "$1/sources" ]; then
  echo "usage: bench/gpu_call.sh CARRIED OUT (CARRIED holds wheels/ and sources/; got: ${1:-nothing})" >&2
  exit 2
fi
C=$(cd "$1" && pwd); OUT=$2
mkdir -p "$OUT"; L=$(mktemp -d); export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/gpu-call.tgz" -C "$L" . ; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  python3 -V; nproc; nvcc --version | tail -n 1; } > "$L/machine.txt" 2>&1
s=$(date +%s)
PIP_NO_INDEX=1 PIP_FIND_LINKS=$C/wheels QWEN38BUILD_NVCC=system QWEN38BUILD_SOURCES=$C/sources \
  QWEN38_GPU_RESULTS=$L/suite timeout "${SUITE_S:-420}" ./noxw -s gpu_tests -- -W default \
  > "$L/suite.log" 2>&1
echo "suite: rc $? in $(( $(date +%s) - s )) s" >> "$L/summary.txt"
grep -E "^(FAILED|ERROR)|passed|failed" "$L/suite.log" | tail -40 >> "$L/summary.txt"
pack
if [ -d "$C/cuts" ]; then
  s=$(date +%s)
  timeout "${CUTS_S:-150}" python3 bench/gpu_series_cuts.py run "$C/cuts" --results "$L/cuts" \
    > "$L/cuts.log" 2>&1
  echo "cuts: rc $? in $(( $(date +%s) - s )) s" >> "$L/summary.txt"
  tail -n 6 "$L/cuts.log" >> "$L/summary.txt"
  pack
fi
cat "$L/summary.txt"
