#!/usr/bin/env bash
# One GPU session for pthfa: build the sm_90 cubin if it was not carried, run the GPU tests,
# run the benchmark. Logs go to $OUT (or ./.devout). Run from the repo root.
set -uo pipefail
OUT=${OUT:-$PWD/.devout}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/pthfa/python:$PWD
CUB=pthfa/python/pthfa/cubins
{ nvidia-smi; nvcc --version; python3 -c 'import torch, cupy; print(torch.__version__, cupy.__version__)'; } >"$OUT/env.txt" 2>&1
if [ ! -f "$CUB/sm_90.cubin" ]; then
  python3 -c "
from pathlib import Path
from qwen38build.kernels import compile_arch
src = sorted(Path('pthfa/csrc').iterdir())
print(compile_arch(src, '9.0', Path('$CUB')))
" 2>&1 | tee "$OUT/build.log"
fi
ls -l "$CUB" | tee -a "$OUT/build.log"
timeout 420 python3 -m pytest tests/gpu -m gpu -p no:cacheprovider -q -rA -s 2>&1 | tee "$OUT/gpu_tests.log"
# every partition kernel variant through the same tests (one line each; details in the log)
for impl in simt mma1 mma2 mma1b mma2b; do
  echo "== PTHFA_IMPL=$impl" >>"$OUT/gpu_tests_impls.log"
  PTHFA_IMPL=$impl timeout 120 python3 -m pytest tests/gpu -m gpu -p no:cacheprovider -q -rA -s \
    >>"$OUT/gpu_tests_impls.log" 2>&1
  echo "PTHFA_IMPL=$impl: $(tail -1 "$OUT/gpu_tests_impls.log")"
done
timeout 360 python3 bench/pthfa_decode.py --out "$OUT/bench.md" 2>&1 | tee "$OUT/bench.log"
