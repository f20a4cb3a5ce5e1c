#!/usr/bin/env python3
"""The load floor of a whole-block decode kernel over the PTHFA backend's pages (issue 25).

A whole-block kernel has one CTA per (sequence, partition) read each block's page for all KV
heads at once. In the backend's layout that page is one contiguous run (K 16 KiB, V 16 KiB,
scales 1 KiB at block 16 for Qwen3-8B's 8 KV heads), so its loads can be plain 16-byte
streaming loads over the whole page. This probe does only those loads (no math), through the
same block tables and pages as ``pthfa.decode`` over the paged views (cp3, one CTA per KV
head), and torch's bf16 SDPA in the same run: what such a kernel could reach at best.

Usage: PYTHONPATH=pthfa/python python3 bench/pthfa_wholeblock_probe.py [--out table.md]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pthfa_decode as B
import pthfa_paged as P

SRC = r"""
extern "C" __global__ void __launch_bounds__(256)
wb_read(const int4* __restrict__ pages, long long page16, const int* __restrict__ bt,
        int bt_stride, int blocks_per_part, int nblk, int* __restrict__ sink) {
  const int part = blockIdx.x, seq = blockIdx.y;
  const int first = part * blocks_per_part;
  const int n = min(blocks_per_part, nblk - first);
  const int* t = bt + (long long)seq * bt_stride + first;
  int x = 0;
  for (int b = 0; b < n; b += 2) {  // two pages in flight per step
    const int4* p0 = pages + (long long)t[b] * page16;
    const int4* p1 = pages + (long long)t[b + 1 < n ? b + 1 : b] * page16;
    const bool two = b + 1 < n;
#pragma unroll 9
    for (int i = threadIdx.x; i < page16; i += 256) {
      const int4 v = __ldcs(p0 + i);
      x ^= v.x ^ v.y ^ v.z ^ v.w;
      if (two) {
        const int4 w = __ldcs(p1 + i);
        x ^= w.x ^ w.y ^ w.z ^ w.w;
      }
    }
  }
  if (x == 0x7fffffff) *sink = x;  // keeps the loads
}
"""


def main() -> int:
    import cupy

    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="64x8192:4/8/16,64x32768:8/16/32")
    args = ap.parse_args()
    import os

    cub = os.environ.get("PTHFA_WB_CUBIN")  # SRC compiled by nvcc (-arch=sm_90 -cubin)
    kern = (cupy.RawModule(path=cub).get_function("wb_read") if cub
            else cupy.RawKernel(SRC, "wb_read"))
    sink = cupy.zeros(1, dtype=cupy.int32)
    gen = torch.Generator(device="cuda").manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    lines = [f"Card: {props.name} ({props.multi_processor_count} SMs), torch "
             f"{torch.__version__}, {datetime.date.today()}", "",
             "| batch | context | what | us | GB/s (page bytes) | SDPA / this |",
             "| ---: | ---: | --- | ---: | ---: | ---: |"]
    for spec in args.shapes.split(","):
        shape, _, parts = spec.partition(":")
        b, ctx = (int(v) for v in shape.split("x"))
        x = P.Paged(b, ctx, gen)
        page = x.pk.stride(0)
        nblk = ctx // B.BS
        nbytes = b * nblk * page
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        pages = cupy.asarray(x.raw)

        def run(nparts: int, tables: list, b: int = b, nblk: int = nblk, page: int = page,
                pages: object = pages, stream: object = stream) -> float:
            bpp = -(-nblk // nparts)
            cts = [cupy.asarray(t) for t in tables]

            def launch(ct: object) -> None:
                kern((nparts, b), (256,), (pages, cupy.int64(page // 16), ct,
                                           cupy.int32(nblk), cupy.int32(bpp),
                                           cupy.int32(nblk), sink), stream=stream)

            for ct in cts:
                launch(ct)
            times = []
            for _ in range(7):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(3):
                    for ct in cts:
                        launch(ct)
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) / 1e3 / (3 * len(cts)))
            return statistics.median(times)

        tables = [x.tables[i] for i in range(x.sets)]
        rows = []
        for nparts in (int(v) for v in parts.split("/")):
            rows.append((f"whole-page loads, random pages, {nparts} parts/seq",
                         run(nparts, tables)))
        order = torch.arange(x.tables.numel(), dtype=torch.int32, device="cuda")
        seqtab = [order.view(x.sets, b, nblk)[i] for i in range(x.sets)]
        best = min(int(v) for v in parts.split("/"))
        rows.append((f"whole-page loads, pages in order, {best} parts/seq",
                     run(best, seqtab)))
        tcp, _ = B.timed(x.paged_fns())
        impl = B._plan.plan(b, B.KVH, ctx, B.BS, B.H // B.KVH, B.D,
                            torch.cuda.get_device_properties(0).multi_processor_count,
                            torch.cuda.get_device_capability(0)[0])[0]
        rows.append((f"pthfa.decode ({impl}) over the same pages, graph", tcp))
        del x, pages
        torch.cuda.empty_cache()
        ts, _, _, _ = B.bench_sdpa(b, ctx, gen)
        for what, t in rows:
            row = (f"| {b} | {ctx} | {what} | {t * 1e6:.1f} | {nbytes / t / 1e9:.0f} | "
                   f"{ts / t:.2f}x |")
            print(row, flush=True)
            lines.append(row)
        lines.append(f"| {b} | {ctx} | torch SDPA bf16, graph | {ts * 1e6:.1f} | | 1.00x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
