#!/usr/bin/env bash
# One GPU session for pthfa: build the cubin for the GPU present if it was not carried, run the
# GPU tests (default dispatch, each forced kernel, CuPy's launch, uneven partitions), then the
# benchmarks: host overhead, eager and graph decode against SDPA, the roofline probes, and
# Nsight Compute's counters where the machine lets it read them.
# Logs go to $OUT (or ./.devout). Run from the repo root.
# $IMPLS: partition kernels to test (forced, one pytest pass each); $SWEEP: partition-size
# sweeps for the benchmark (bench/pthfa_decode.py --sweep); $BENCH=0 skips the benchmarks,
# $BENCH=host runs only the host-overhead one.
set -uo pipefail
OUT=${OUT:-$PWD/.devout}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/pthfa/python:$PWD
IMPLS=${IMPLS:-simt,mma1,cp4,wt6}
SWEEP=${SWEEP:-}
BENCH=${BENCH:-1}
CUB=pthfa/python/pthfa/cubins
{ nvidia-smi; nvcc --version; uname -r; python3 -c 'import torch, cupy; print(torch.__version__, cupy.__version__, torch.cuda.device_count())'; } >"$OUT/env.txt" 2>&1
ARCH=$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
if [ ! -f "$CUB/sm_${ARCH/./}.cubin" ]; then
  python3 -c "
import time
from pathlib import Path
from qwen38build.kernels import compile_arch
t = time.time()
src = sorted(Path('pthfa/csrc').iterdir())
print(compile_arch(src, '$ARCH', Path('$CUB')), f'{time.time() - t:.0f} s')
" 2>&1 | tee "$OUT/build.log"
fi
ls -l "$CUB" | tee -a "$OUT/build.log"
timeout 240 python3 -m pytest tests/gpu -m gpu -p no:cacheprovider -q -rA -s 2>&1 | tee "$OUT/gpu_tests.log"
# every partition kernel through the same tests (one line each; details in the log), CuPy's
# launch, then the default kernel with partitions that are not a power of two
for run in ${IMPLS//,/ } launch:cupy default:2720; do
  case $run in
    default:*) env=(PTHFA_PART_SIZE="${run#default:}") ;;
    launch:*) env=(PTHFA_LAUNCH="${run#launch:}") ;;
    *) env=(PTHFA_IMPL="$run") ;;
  esac
  echo "== ${env[*]}" >>"$OUT/gpu_tests_impls.log"
  env "${env[@]}" timeout 150 python3 -m pytest tests/gpu -m gpu -p no:cacheprovider -q -rA -s \
    >>"$OUT/gpu_tests_impls.log" 2>&1
  echo "${env[*]}: $(tail -1 "$OUT/gpu_tests_impls.log")"
done
[ "$BENCH" = 0 ] && exit 0
timeout 120 python3 bench/pthfa_host.py --calls 1000 --runs 7 --profile 2>&1 | tee "$OUT/host.log"
[ "$BENCH" = host ] && exit 0
timeout 300 python3 bench/pthfa_decode.py --out "$OUT/bench.md" --sweep "$SWEEP" 2>&1 \
  | tee "$OUT/bench.log"
timeout 200 python3 bench/pthfa_roofline.py --out "$OUT/roofline.md" 2>&1 | tee "$OUT/roofline.log"
if command -v ncu >/dev/null; then
  timeout 150 ncu --clock-control none --kernel-name regex:pthfa --launch-count 4 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_bytes.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,sm__warps_active.avg.pct_of_peak_sustained_active \
    python3 bench/pthfa_one.py 2>&1 | tee "$OUT/ncu.log"
fi
