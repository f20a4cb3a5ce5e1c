#!/usr/bin/env python3
"""Benchmark pthfa's int8 paged decode attention on the GPU, in one run.

1. the card's copy bandwidth (device-to-device copy; bytes read + written / time);
2. pthfa.decode at batch 1/8/64 x context 1k/8k/32k, Qwen3-8B's attention shape (32 query
   heads, 8 KV heads, head_dim 128, block_size 16): bytes of int8 K+V, their fp32 scales,
   the query and the output over the median time of CUDA-graph replays (CUDA events);
3. torch's scaled_dot_product_attention over a bf16 KV of the same shape (fastest backend
   that runs, enable_gqa=True), timed the same way.
Inputs rotate over several sets so the cases read device memory, not the 60 MB L2.
Usage: PYTHONPATH=pthfa/python python3 bench/pthfa_decode.py [--out table.md]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pthfa" / "python"))
import pthfa
from pthfa import _launch as pthfa_launch

H, KVH, D, BS = 32, 8, 128, 16
ROT_BYTES = 512 << 20  # rotate inputs until a replay of all sets reads at least this much


def timed(fn_list, reps: int = 15, graph: bool = True) -> tuple[float, str]:
    """Median seconds per call of the functions in fn_list (run in turn), via graph replay."""
    for fn in fn_list:  # warm-up (module load, allocator)
        fn()
    torch.cuda.synchronize()
    how = "graph"
    try:
        if not graph:
            raise RuntimeError("no graph asked")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for fn in fn_list:
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for fn in fn_list:
                fn()
        run = g.replay
        run()
    except Exception as exc:
        how = f"loop ({type(exc).__name__})"

        def run() -> None:
            for fn in fn_list:
                fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / len(fn_list))
    return statistics.median(times), how


def copy_bandwidth() -> float:
    """Best of a few large device-to-device copies (uint8 and fp32 views of 4 GiB)."""
    n = 4 << 30
    x = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    best = 0.0
    for xs, ys in ((x, y), (x.view(torch.float32), y.view(torch.float32))):
        # no graph: a captured memcpy runs on the copy engines, slower than the SMs
        t, _ = timed([lambda xs=xs, ys=ys: ys.copy_(xs)], reps=20, graph=False)
        best = max(best, 2 * n / t)
    del x, y
    torch.cuda.empty_cache()
    return best


def bench_pthfa(b: int, ctx: int, gen: torch.Generator,
                part_size: int | None = None) -> tuple[float, int, str]:
    nblk = ctx // BS
    case_bytes = b * ctx * KVH * (2 * D + 8)
    sets = max(1, min(64, math.ceil(ROT_BYTES / case_bytes)))
    total = sets * b * nblk
    k_cache = torch.randint(-127, 128, (total, BS, KVH, D), dtype=torch.int8, device="cuda",
                            generator=gen)
    v_cache = torch.randint(-127, 128, (total, BS, KVH, D), dtype=torch.int8, device="cuda",
                            generator=gen)
    k_scale = torch.rand((total, BS, KVH), device="cuda", generator=gen) * 0.02 + 0.001
    v_scale = torch.rand((total, BS, KVH), device="cuda", generator=gen) * 0.02 + 0.001
    perm = torch.randperm(total, device="cuda", generator=gen).to(torch.int32)
    tables = perm.view(sets, b, nblk)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    qs = [torch.randn((b, H, D), device="cuda", generator=gen).to(torch.bfloat16)
          for _ in range(sets)]
    outs = [torch.empty_like(q) for q in qs]
    fns = [
        (lambda i=i: pthfa.decode(qs[i], k_cache, v_cache, k_scale, v_scale, tables[i], lens,
                                  max_seq_len=ctx, out=outs[i], part_size=part_size))
        for i in range(sets)
    ]
    t, how = timed(fns)
    nbytes = case_bytes + 2 * b * H * D * 2 + b * nblk * 4 + b * 4
    return t, nbytes, how


def bench_sdpa(b: int, ctx: int, gen: torch.Generator) -> tuple[float, int, str]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    case_bytes = b * ctx * KVH * D * 2 * 2
    sets = max(1, min(64, math.ceil(ROT_BYTES / case_bytes)))
    k = torch.randn((sets, b, KVH, ctx, D), device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn((sets, b, KVH, ctx, D), device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn((sets, b, H, 1, D), device="cuda", generator=gen).to(torch.bfloat16)
    best = None
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        def one(i: int, backend=backend) -> None:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q[i], k[i], v[i], enable_gqa=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t, how = timed([lambda i=i: one(i) for i in range(sets)])
        except RuntimeError:
            continue
        if best is None or t < best[0]:
            best = (t, backend.name.lower(), how)
        if backend == SDPBackend.CUDNN_ATTENTION and best is not None:
            break  # skip MATH when a fused backend ran
    k = v = q = torch.empty(0)  # free the GPU memory (the closures above are done)
    torch.cuda.empty_cache()
    nbytes = case_bytes + 2 * b * H * D * 2
    assert best is not None, "no SDPA backend ran"
    return best[0], nbytes, f"{best[1]}, {best[2]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--ctx", default="1024,8192,32768")
    ap.add_argument("--impls", default="simt,mma1,cp3,cp4",
                    help="partition kernels to time on every shape (comma list; '' for none)")
    ap.add_argument("--sweep", default="",
                    help="partition-size sweeps: IMPL:BxCTX:P1/P2/...;... (any multiple of 16)")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    lines = [
        f"Card: {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), "
        f"torch {torch.__version__}, {datetime.date.today().isoformat()}",
        f"Copy bandwidth (device-to-device, read + written): {bw / 1e9:.0f} GB/s",
        f"Shape: {H} query heads, {KVH} KV heads, head_dim {D}, block_size {BS}, bf16 query",
        "",
        "| batch | context | kernel (part) | pthfa us | pthfa GB/s | % of copy BW | SDPA bf16 us "
        "| SDPA GB/s | SDPA backend | speedup |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for b in (int(x) for x in args.batches.split(",")):
        for ctx in (int(x) for x in args.ctx.split(",")):
            tp, bp, howp = bench_pthfa(b, ctx, gen)
            torch.cuda.empty_cache()
            ts, bs_, hows = bench_sdpa(b, ctx, gen)
            impl, part = pthfa_launch.plan(b, KVH, ctx, BS, H // KVH, D,
                                           props.multi_processor_count)
            row = (f"| {b} | {ctx} | {impl} ({part}) | {tp * 1e6:.1f} | {bp / tp / 1e9:.0f} | "
                   f"{100 * bp / tp / bw:.0f}% | {ts * 1e6:.1f} | {bs_ / ts / 1e9:.0f} | {hows} | "
                   f"{ts / tp:.2f}x |")
            lines.append(row)
            sys.stdout.write(row + f"  <!-- pthfa timing: {howp} -->\n")
            sys.stdout.flush()
    lines.append("")
    impls = [x for x in args.impls.split(",") if x]
    if impls:
        lines.append("Partition kernels, forced ($PTHFA_IMPL; auto partition size), us "
                     "(% of copy BW):")
        lines.append("")
        lines.append("| batch | context | " + " | ".join(impls) + " |")
        lines.append("| ---: | ---: |" + " ---: |" * len(impls))
        for b in (int(x) for x in args.batches.split(",")):
            for ctx in (int(x) for x in args.ctx.split(",")):
                cells = []
                for impl in impls:
                    os.environ["PTHFA_IMPL"] = impl
                    try:
                        tp, bp, _ = bench_pthfa(b, ctx, gen)
                        cells.append(f"{tp * 1e6:.1f} ({100 * bp / tp / bw:.0f}%)")
                    except Exception as exc:
                        cells.append(f"failed: {type(exc).__name__}")
                    torch.cuda.empty_cache()
                lines.append(f"| {b} | {ctx} | " + " | ".join(cells) + " |")
                sys.stdout.write(lines[-1] + "\n")
        os.environ.pop("PTHFA_IMPL", None)
    # partition-size sweeps: IMPL:BxCTX:P1/P2/...;...
    if args.sweep:
        lines.append("")
        lines.append("Partition size sweeps ($PTHFA_IMPL, $PTHFA_PART_SIZE), us (% of copy BW):")
        for item in args.sweep.split(";"):
            impl, shape, parts = item.split(":")
            b, ctx = (int(x) for x in shape.split("x"))
            os.environ["PTHFA_IMPL"] = impl
            cells = []
            for part in parts.split("/"):
                os.environ["PTHFA_PART_SIZE"] = part
                try:
                    tp, bp, _ = bench_pthfa(b, ctx, gen)
                    cells.append(f"{part}: {tp * 1e6:.1f} ({100 * bp / tp / bw:.0f}%)")
                except Exception as exc:
                    cells.append(f"{part}: failed: {type(exc).__name__}")
                torch.cuda.empty_cache()
            lines.append(f"- {impl} {b}x{ctx}: " + "; ".join(cells))
            sys.stdout.write(lines[-1] + "\n")
        os.environ.pop("PTHFA_IMPL", None)
        os.environ.pop("PTHFA_PART_SIZE", None)
    text = "\n".join(lines) + "\n"
    sys.stdout.write("\n" + text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
