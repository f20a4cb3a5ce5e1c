#!/usr/bin/env bash
# One GPU session for fa2/: build both libraries for sm_90 on the host's cores, test, bench.
#   bench/fa2_gpu.sh SOURCES_DIR OUT_DIR [JOBS]
# Run from a checkout (or a copy holding fa2/, tests/gpu/, bench/, pthfa/). SOURCES_DIR holds
# vllm-flash-attention-617264c1.tar.xz and cutlass-62750a2b-include.tar.xz. OUT_DIR gets the
# logs, build summaries, the test's and the bench's tables.
set -u
SRC=$1 OUT=$2 JOBS=${3:-16}
W=$(mktemp -d /tmp/fa2gpu.XXXXXX)
mkdir -p "$OUT"
tar xf "$SRC"/vllm-flash-attention-617264c1.tar.xz -C "$W"
tar xf "$SRC"/cutlass-62750a2b-include.tar.xz -C "$W"
cp -a "$W/flash-attention" "$W/stock"
(cd "$W/flash-attention" && patch -p1 --fuzz=0 --no-backup-if-mismatch) < fa2/fp8-kv.diff \
    > "$OUT/patch.log" 2>&1 || { cat "$OUT/patch.log"; exit 1; }
NVCC=$(command -v nvcc)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "cores: $(nproc)"
# The two libraries build side by side (14 units on the host's cores); pthfa's cubin beside.
t0=$(date +%s)
python3 fa2/build.py --tree "$W/flash-attention" --cutlass "$W/cutlass" --ours fa2 --nvcc "$NVCC" \
    --arch 9.0 --out "$W/lib" -j "$JOBS" > "$OUT/build-fp8.log" 2>&1 &
p1=$!
python3 fa2/build.py --tree "$W/stock" --cutlass "$W/cutlass" --ours fa2 --nvcc "$NVCC" \
    --arch 9.0 --out "$W/lib" -j "$JOBS" --stock > "$OUT/build-stock.log" 2>&1 &
p2=$!
if [ -d ../qwen38build ] || [ -d qwen38build ]; then
    PYTHONPATH=$(cd .. && pwd):${PYTHONPATH:-} python3 - "$W/cubins" > "$OUT/build-pthfa.log" 2>&1 <<'EOF' &
import sys
from pathlib import Path
from qwen38build.kernels.kernels import compile_arch
src = sorted(Path("pthfa/csrc").iterdir())
print(compile_arch(src, "9.0", Path(sys.argv[1])))
EOF
    p3=$!
else
    p3=
fi
wait $p1; r1=$?
wait $p2; r2=$?
[ -n "$p3" ] && wait $p3
echo "builds: fp8 rc $r1, stock rc $r2, $(( $(date +%s) - t0 )) s wall together"
tail -n 12 "$OUT/build-fp8.log" "$OUT/build-stock.log" "$OUT/build-pthfa.log" 2>/dev/null
cp "$W"/lib/*.json "$OUT"/ 2>/dev/null
[ $r1 -eq 0 ] && [ $r2 -eq 0 ] || exit 1
export FA2FP8_LIB_DIR="$W/lib" PTHFA_CUBIN_DIR="$W/cubins" QWEN38_GPU_RESULTS="$OUT"
python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_fa2_fp8_gpu.py 2>&1 | tail -n 40
python3 bench/fa2_fp8.py --out "$OUT/bench.md"
