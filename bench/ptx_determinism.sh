#!/usr/bin/env bash
# How often does nvcc give different PTX (or cubin) for the same source, and does turning
# off address-space randomisation (setarch -R) make it stable?
#   bash bench/ptx_determinism.sh [N] [JOBS]
# Compiles pthfa's unit N times per mode, JOBS at once, each in its own folder and TMPDIR;
# prints each mode's distinct sha256s with their counts.
set -euo pipefail
N=${1:-32}; JOBS=${2:-16}
SRC=$(cd "$(dirname "$0")/../pthfa/csrc" && pwd)
WORK=$(mktemp -d)
one() {  # mode index
  local d="$WORK/$1-$2"; mkdir -p "$d/tmp"; cp "$SRC"/* "$d/"
  printf '#include "decode.cu"\n#include "quantize.cu"\n' > "$d/unit.cu"
  local pre=(); [ "$1" = norandom ] && pre=(setarch "$(uname -m)" -R)
  (cd "$d" && env -i PATH="$(dirname "$(command -v nvcc)"):/usr/bin:/bin" LC_ALL=C TZ=UTC \
     HOME="$d/tmp" TMPDIR="$d/tmp" "${pre[@]}" nvcc -O3 -std=c++17 --restrict -ptx \
     -arch=compute_90 -o a.ptx unit.cu && \
   env -i PATH="$(dirname "$(command -v nvcc)"):/usr/bin:/bin" LC_ALL=C TZ=UTC \
     HOME="$d/tmp" TMPDIR="$d/tmp" "${pre[@]}" nvcc -O3 -std=c++17 --restrict -cubin \
     -gencode arch=compute_90,code=sm_90 -o a.cubin unit.cu)
}
export -f one; export WORK SRC
for mode in random norandom; do
  seq "$N" | xargs -P "$JOBS" -I{} bash -c "one $mode {}"
  echo "== $mode: ptx"; sha256sum "$WORK"/$mode-*/a.ptx | awk '{print $1}' | sort | uniq -c
  echo "== $mode: cubin"; sha256sum "$WORK"/$mode-*/a.cubin | awk '{print $1}' | sort | uniq -c
done
if [ -n "${OUT:-}" ]; then
  for mode in random norandom; do
    for f in "$WORK"/$mode-*/a.ptx; do
      h=$(sha256sum "$f" | cut -c1-12); cp -n "$f" "$OUT/$mode-$h.ptx" 2>/dev/null || true
    done
  done
fi
rm -rf "$WORK"
