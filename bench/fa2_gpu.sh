#!/usr/bin/env bash
# One GPU session for fa2/: build both libraries for sm_90 on the host's cores, test, bench.
#   bench/fa2_gpu.sh SOURCES_DIR OUT_DIR [JOBS]
# Run from a checkout (or a copy holding fa2/, tests/gpu/, bench/, pthfa/; qwen38build/ there
# or one folder up builds pthfa's cubin for the bench). SOURCES_DIR holds
# vllm-flash-attention-617264c1.tar.xz and cutlass-62750a2b-include.tar.xz. OUT_DIR gets
# build.txt (patch, build logs and summaries), ptxas.txt (registers and spills per kernel),
# test.txt and fa2_fp8_gpu.md (the GPU test), bench.md. FA2_DIFF=PATH tries another diff.
set -u
SRC=$1 OUT=$2 JOBS=${3:-16}
W=$(mktemp -d /tmp/fa2gpu.XXXXXX)
mkdir -p "$OUT"
tar xf "$SRC"/vllm-flash-attention-617264c1.tar.xz -C "$W"
tar xf "$SRC"/cutlass-62750a2b-include.tar.xz -C "$W"
cp -a "$W/flash-attention" "$W/stock"
DIFF=${FA2_DIFF:-fa2/fp8-kv.diff}  # another diff (e.g. a candidate under fa2/candidates/) to try
{ echo "== patch -p1 --fuzz=0 < $DIFF"; (cd "$W/flash-attention" && patch -p1 --fuzz=0 --no-backup-if-mismatch) < "$DIFF"; } \
    > "$W/patch.log" 2>&1 || { cat "$W/patch.log"; exit 1; }
NVCC=$(command -v nvcc)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "cores: $(nproc); $($NVCC --version | tail -n 1)"
QB=""
for d in . ..; do [ -d "$d/qwen38build" ] && QB=$(cd "$d" && pwd); done
# The two libraries build side by side (14 units on the host's cores), pthfa's cubin beside.
t0=$(date +%s)
python3 fa2/build.py --tree "$W/flash-attention" --cutlass "$W/cutlass" --ours fa2 --nvcc "$NVCC" \
    --arch 9.0 --out "$W/lib" -j "$JOBS" --nvcc-flag=--ptxas-options=-v > "$W/build-fp8.log" 2>&1 &
p1=$!
python3 fa2/build.py --tree "$W/stock" --cutlass "$W/cutlass" --ours fa2 --nvcc "$NVCC" \
    --arch 9.0 --out "$W/lib" -j "$JOBS" --stock --nvcc-flag=--ptxas-options=-v > "$W/build-stock.log" 2>&1 &
p2=$!
p3=""
if [ -n "$QB" ]; then
    PYTHONPATH=$QB python3 - "$W/cubins" > "$W/build-pthfa.log" 2>&1 <<'PY' &
import sys, time
from pathlib import Path
from qwen38build.kernels.kernels import compile_arch
t = time.monotonic()
print(compile_arch(sorted(Path("pthfa/csrc").iterdir()), "9.0", Path(sys.argv[1])), f"{time.monotonic() - t:.1f} s")
PY
    p3=$!
fi
wait $p1; r1=$?
wait $p2; r2=$?
[ -n "$p3" ] && wait $p3
{ echo "builds: fp8 rc $r1, stock rc $r2, $(( $(date +%s) - t0 )) s wall together on $(nproc) cores"
  cat "$W/patch.log" "$W/build-fp8.log" "$W/build-stock.log" "$W/build-pthfa.log" 2>/dev/null
  cat "$W"/lib/*.json 2>/dev/null; } > "$OUT/build.txt"
cat "$W"/lib/*.so.log > "$OUT/ptxas.txt" 2>/dev/null
head -n 40 "$OUT/build.txt"
grep -h "spill" "$OUT/ptxas.txt" | sort | uniq -c | sort -rn | head -n 8
[ $r1 -eq 0 ] && [ $r2 -eq 0 ] || exit 1
export FA2FP8_LIB_DIR="$W/lib" PTHFA_CUBIN_DIR="$W/cubins" QWEN38_GPU_RESULTS="$OUT"
python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_fa2_fp8_gpu.py > "$OUT/test.txt" 2>&1
tail -n 25 "$OUT/test.txt"
python3 bench/fa2_fp8.py --out "$OUT/bench.md"
