#!/usr/bin/env python3
"""FA2 split-KV paged decode: fp8 (e4m3) KV cache against the stock bf16 KV path and pthfa.

Three decode kernels over Qwen3-8B's attention shape (32 query heads, 8 KV heads, head_dim 128,
block_size 16, bf16 queries), batch x context over a grid:
  - fa2 fp8: libfa2fp8 (the FA2 tree patched with fa2/fp8-kv.diff), per-KV-head descales;
  - fa2 bf16: libfa2stock (the same tree unpatched, the same C entry), bf16 cache;
  - pthfa: the stack's int8 per-token-head kernels (skipped, and said so, without cubins).
Each call is captured in a CUDA graph with the others of its set and replayed (kernel time, no
Python in it); inputs rotate over several sets so each replay reads device memory, not the L2.
Times are the median of --reps replays, per call. The split count is the library's own choice.

Usage: FA2FP8_LIB_DIR=DIR [PTHFA_CUBIN_DIR=DIR] python3 bench/fa2_fp8.py [--out table.md]
"""

from __future__ import annotations

import argparse
import datetime
import math
import signal
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fa2" / "python"))
sys.path.insert(0, str(ROOT / "pthfa" / "python"))
import fa2fp8  # noqa: E402

H, KVH, D, BS = 32, 8, 128, 16
ROT_BYTES = 512 << 20  # rotate inputs until one replay of all sets reads at least this much
DEV = "cuda"


def timed(fns: list[Callable[[], Any]], reps: int) -> float:
    """Median seconds per call of fns (run in turn), by CUDA-graph replay."""
    for fn in fns:  # warm-up: library load, allocator
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / len(fns))
    del g
    return statistics.median(times)


class Shape:
    """One batch x context case: block tables, lengths and queries, in `sets` copies."""

    def __init__(self, b: int, ctx: int, kv_bytes_per_elem: float, gen: torch.Generator) -> None:
        self.b, self.ctx = b, ctx
        self.nblk = math.ceil(ctx / BS)
        case_bytes = b * ctx * KVH * D * 2 * kv_bytes_per_elem
        self.sets = max(1, min(64, math.ceil(ROT_BYTES / case_bytes)))
        self.total = self.sets * b * self.nblk
        perm = torch.randperm(self.total, device=DEV, generator=gen).to(torch.int32)
        self.tables = perm.view(self.sets, b, self.nblk)
        self.lens = torch.full((b,), ctx, dtype=torch.int32, device=DEV)
        self.qs = [torch.randn((b, H, D), device=DEV, generator=gen).to(torch.bfloat16)
                   for _ in range(self.sets)]
        self.outs = [torch.empty_like(q) for q in self.qs]


def fa2_fns(s: Shape, fp8: bool, gen: torch.Generator, num_splits: int = 0,
            combine_kernel: bool = False) -> tuple[list[Callable[[], Any]], list[Any]]:
    shape = (s.total, BS, KVH, D)
    if fp8:
        e4m3 = torch.float8_e4m3fn
        k = (torch.randn(shape, device=DEV, generator=gen, dtype=torch.float16) * 40).to(e4m3)
        v = (torch.randn(shape, device=DEV, generator=gen, dtype=torch.float16) * 40).to(e4m3)
        ks = torch.rand((KVH,), device=DEV, generator=gen) / 40 + 1e-3
        vs = torch.rand((KVH,), device=DEV, generator=gen) / 40 + 1e-3
    else:
        k = torch.randn(shape, device=DEV, generator=gen, dtype=torch.bfloat16)
        v = torch.randn(shape, device=DEV, generator=gen, dtype=torch.bfloat16)
        ks = vs = None
    fns = [(lambda i=i: fa2fp8.paged_decode(s.qs[i], k, v, s.tables[i], s.lens, k_descale=ks,
                                            v_descale=vs, max_seq_len=s.ctx, out=s.outs[i],
                                            num_splits=num_splits,
                                            combine_kernel=combine_kernel))
           for i in range(s.sets)]
    return fns, [k, v]


def pthfa_fns(s: Shape, gen: torch.Generator) -> tuple[list[Callable[[], Any]], list[Any]]:
    import pthfa

    shape = (s.total, BS, KVH, D)
    k = torch.randint(-127, 128, shape, dtype=torch.int8, device=DEV, generator=gen)
    v = torch.randint(-127, 128, shape, dtype=torch.int8, device=DEV, generator=gen)
    ks = torch.rand(shape[:3], device=DEV, generator=gen) * 0.02 + 0.001
    vs = torch.rand(shape[:3], device=DEV, generator=gen) * 0.02 + 0.001
    fns = [(lambda i=i: pthfa.decode(s.qs[i], k, v, ks, vs, s.tables[i], s.lens,
                                     max_seq_len=s.ctx, out=s.outs[i]))
           for i in range(s.sets)]
    return fns, [k, v, ks, vs]


def pthfa_ready() -> str:
    """'' when pthfa can run here, else why not."""
    try:
        import cupy  # noqa: F401

        import pthfa
        major, minor = torch.cuda.get_device_capability()
        pthfa.find_cubin(major, minor)
    except Exception as exc:  # any reason pthfa cannot run is reported, not raised
        return f"{type(exc).__name__}: {exc}"
    return ""


def parse_args(default_grid: str) -> tuple[argparse.Namespace, list[tuple[int, int]]]:
    """--out, --grid (batch x context, comma-separated) and --reps, and the grid parsed; one
    line and exit 2 for a bad value, no CUDA GPU or a missing library (before any work), and
    a quiet end when the output's reader goes away (`| head`)."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--grid", default=default_grid, help=f"default {default_grid}")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    try:
        grid = [(int(b), int(c)) for b, c in (cell.split("x") for cell in args.grid.split(","))]
    except ValueError:
        ap.error(f"--grid {args.grid!r}: give BATCHxCONTEXT cells separated by commas")
    if any(b <= 0 or c <= 0 for b, c in grid) or args.reps <= 0:
        ap.error("--grid sizes and --reps must be positive")
    if not torch.cuda.is_available():
        ap.error("no CUDA GPU visible to torch: the FA2 benches time kernels on one")
    for kind in ("fp8", "stock"):
        try:
            fa2fp8.find_library(kind, *torch.cuda.get_device_capability())
        except FileNotFoundError as e:
            ap.error(f"{e} (FA2FP8_LIB_DIR names the folder)")
    return args, grid


def main() -> int:
    args, grid = parse_args("1x1024,1x8192,8x8192,32x8192,64x8192,8x32768,64x32768")
    gen = torch.Generator(device=DEV).manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    major, minor = props.major, props.minor
    libs = {k: fa2fp8.find_library(k, major, minor).name for k in ("fp8", "stock")}
    no_pthfa = pthfa_ready()
    lines = [
        f"Card: {props.name} (sm_{major}{minor}, {props.multi_processor_count} SMs), "
        f"torch {torch.__version__}, {datetime.date.today().isoformat()}; "
        f"{libs['fp8']}, {libs['stock']}",
        f"Shape: {H} query heads, {KVH} KV heads, head_dim {D}, block_size {BS}, bf16 query, "
        f"shuffled block tables; CUDA-graph replay, median of {args.reps} replays, per call.",
        "pthfa: " + (f"not run ({no_pthfa})" if no_pthfa
                     else "int8 K/V with per-token-head fp32 scales"),
        "",
        "| batch | context | splits | fa2 fp8 us | fa2 bf16 us | fp8 speedup | fp8 KV GB/s "
        "| bf16 KV GB/s | pthfa int8 us |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    print("\n".join(lines), flush=True)
    fp8_lib = fa2fp8.load("fp8", major, minor)
    for b, ctx in grid:
        splits = int(fp8_lib.num_splits(b, H, KVH, D, ctx))
        row = {}
        for name in ("fp8", "bf16", "pthfa"):
            if name == "pthfa" and no_pthfa:
                row[name] = float("nan")
                continue
            s = Shape(b, ctx, {"fp8": 1, "bf16": 2, "pthfa": 1.03}[name], gen)
            fns, keep = (pthfa_fns(s, gen) if name == "pthfa" else fa2_fns(s, name == "fp8", gen))
            row[name] = timed(fns, args.reps)
            del fns, keep, s
            torch.cuda.empty_cache()
        kv = b * ctx * KVH * D * 2
        line = (f"| {b} | {ctx} | {splits} | {row['fp8'] * 1e6:.1f} | {row['bf16'] * 1e6:.1f} | "
                f"{row['bf16'] / row['fp8']:.2f}x | {kv / row['fp8'] / 1e9:.0f} | "
                f"{2 * kv / row['bf16'] / 1e9:.0f} | "
                + ("-" if math.isnan(row["pthfa"]) else f"{row['pthfa'] * 1e6:.1f}") + " |")
        lines.append(line)
        print(line, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
