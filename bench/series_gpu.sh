#!/usr/bin/env bash
# The GPU tests of the series' patches (tests/gpu/test_*_gpu.py but pthfa's) on a device
# machine where the engine cannot build the trees: $1 is a zip holding pristine/vllm and
# patched/vllm (the .py files of the two wheels, as bench/series_gpu_pack.py writes it).
# Logs and the figures (results.txt) go to $OUT (or ./.devout). Run from the repo root.
set -uo pipefail
OUT=${OUT:-$PWD/.devout}
mkdir -p "$OUT"
zip=${1:?a zip of pristine/vllm and patched/vllm}
trees=$(mktemp -d)
python3 -m zipfile -e "$zip" "$trees"
export QWEN38_VLLM_TREES=$trees QWEN38_GPU_RESULTS=$OUT/results.txt PYTHONPATH=$PWD \
  PYTHONUNBUFFERED=1 QWEN38_GPU_REQUIRED=1
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >"$OUT/results.txt"
mapfile -t files < <(ls tests/gpu/test_*_gpu.py | grep -v pthfa)
# -W default: a library's deprecation warning is shown, not turned into a failure
timeout "${TIMEOUT:-300}" python3 -m pytest -m gpu -p no:cacheprovider -q -rA -W default \
  "${files[@]}" "${@:2}" 2>&1 | tee "$OUT/pytest.log"
