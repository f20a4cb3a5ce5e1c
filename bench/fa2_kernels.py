#!/usr/bin/env python3
"""Where an FA2 decode's time goes: each kernel's device time, by CUPTI (torch.profiler).

bench/fa2_fp8.py times whole calls by CUDA-graph replay; this splits a call into its kernels
(the decode kernel, FA2's combine kernel when it runs) for the fp8 library merging in the
kernel, the fp8 library with FA2's combine kernel, and the stock bf16 library, over
bench/fa2_fp8.py's shape and rotating inputs. The gap between a call's replay time and the
sum of its kernels is launch and dependency latency.

Usage: FA2FP8_LIB_DIR=DIR python3 bench/fa2_kernels.py [--grid 1x1024,1x8192] [--reps 15]
"""

from __future__ import annotations

import collections
import sys

import fa2_fp8 as fb  # (bench/, this script's folder, is on sys.path)
import torch
from torch.profiler import ProfilerActivity, profile


def short(name: str) -> str:
    """A kernel's name without its template arguments."""
    return name.split("<", 1)[0].split("(", 1)[0].rsplit("::", 1)[-1]


def kernel_times(fns: list, reps: int) -> dict[str, float]:
    """Mean device microseconds per call of each kernel the calls launch."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
    total: dict[str, float] = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            total[short(ev.name)] += ev.device_time_total
    calls = reps * len(fns)
    return {k: v / calls for k, v in total.items()}


def main() -> int:
    args, grid = fb.parse_args("1x1024,1x8192,8x8192")
    gen = torch.Generator(device=fb.DEV).manual_seed(0)
    lines = ["| batch x context | path | splits | kernels (us a call, device time) | sum us "
             "| graph us |", "|---|---|---:|---|---:|---:|"]
    print("\n".join(lines), flush=True)
    props = torch.cuda.get_device_properties(0)
    for b, ctx in grid:
        for path in ("fp8 merge in kernel", "fp8 + combine kernel", "bf16 stock"):
            fp8 = path.startswith("fp8")
            lib = fb.fa2fp8.load("fp8" if fp8 else "stock", props.major, props.minor)
            splits = int(lib.num_splits(b, fb.H, fb.KVH, fb.D, ctx))
            s = fb.Shape(b, ctx, 1 if fp8 else 2, gen)
            fns, keep = fb.fa2_fns(s, fp8, gen, combine_kernel=path == "fp8 + combine kernel")
            ks = kernel_times(fns, args.reps)
            graph = fb.timed(fns, args.reps) * 1e6
            del fns, keep, s
            torch.cuda.empty_cache()
            cell = ", ".join(f"{k} {v:.1f}" for k, v in sorted(ks.items(), key=lambda kv: -kv[1]))
            line = (f"| {b} x {ctx} | {path} | {splits} | {cell or 'none recorded'} | "
                    f"{sum(ks.values()):.1f} | {graph:.1f} |")
            lines.append(line)
            print(line, flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
