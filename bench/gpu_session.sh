#!/usr/bin/env bash
# One GPU session for pthfa: build the sm_90 cubin if it was not carried, run the GPU tests,
# run the benchmark. Logs go to $OUT (or ./.devout). Run from the repo root.
# $IMPLS: partition kernels to test (forced, one pytest pass each) and time on every shape;
# $SWEEP: partition-size sweeps for the benchmark (bench/pthfa_decode.py --sweep).
set -uo pipefail
OUT=${OUT:-$PWD/.devout}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/pthfa/python:$PWD
IMPLS=${IMPLS:-simt,mma1,cp3,cp4}
SWEEP=${SWEEP:-}
CUB=pthfa/python/pthfa/cubins
{ nvidia-smi; nvcc --version; python3 -c 'import torch, cupy; print(torch.__version__, cupy.__version__)'; } >"$OUT/env.txt" 2>&1
if [ ! -f "$CUB/sm_90.cubin" ]; then
  python3 -c "
import time
from pathlib import Path
from qwen38build.kernels import compile_arch
t = time.time()
src = sorted(Path('pthfa/csrc').iterdir())
print(compile_arch(src, '9.0', Path('$CUB')), f'{time.time() - t:.0f} s')
" 2>&1 | tee "$OUT/build.log"
fi
ls -l "$CUB" | tee -a "$OUT/build.log"
timeout 180 python3 -m pytest tests/gpu -m gpu -p no:cacheprovider -q -rA -s 2>&1 | tee "$OUT/gpu_tests.log"
# every partition kernel through the same tests (one line each; details in the log), then the
# default kernel once more with partitions that are not a power of two
runs="${IMPLS//,/ }"
for impl in $runs default:2720; do
  env=(PTHFA_IMPL="$impl")
  case $impl in default:*) env=(PTHFA_PART_SIZE="${impl#default:}") ;; esac
  echo "== ${env[*]}" >>"$OUT/gpu_tests_impls.log"
  env "${env[@]}" timeout 120 python3 -m pytest tests/gpu -m gpu -p no:cacheprovider -q -rA -s \
    >>"$OUT/gpu_tests_impls.log" 2>&1
  echo "${env[*]}: $(tail -1 "$OUT/gpu_tests_impls.log")"
done
timeout 330 python3 bench/pthfa_decode.py --out "$OUT/bench.md" --impls "$IMPLS" \
  --sweep "$SWEEP" 2>&1 | tee "$OUT/bench.log"
