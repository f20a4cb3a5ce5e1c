#!/usr/bin/env python3
"""Benchmark pthfa's int8 paged decode attention on the GPU, in one run.

1. the card's copy bandwidth (device-to-device copy; bytes read + written / time);
2. pthfa.decode at batch 1/8/64 x context 1k/8k/32k, Qwen3-8B's attention shape (32 query
   heads, 8 KV heads, head_dim 128, block_size 16), eager (a Python loop of calls, CUDA
   events around it) and in a CUDA graph (replays): bytes of int8 K+V, their fp32 scales,
   the query and the output over the median time;
3. torch's scaled_dot_product_attention over a bf16 KV of the same shape (fastest backend
   that runs, enable_gqa=True), timed the same two ways.
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
from pthfa import _ops, _plan

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


class Inputs:
    """One shape's inputs, in ``sets`` copies (rotated so that a replay of all of them reads
    device memory, not the L2): the int8 caches and scales, block tables, queries, outputs."""

    def __init__(self, b: int, ctx: int, gen: torch.Generator) -> None:
        self.b, self.ctx = b, ctx
        self.nblk = ctx // BS
        self.case_bytes = b * ctx * KVH * (2 * D + 8)
        self.sets = max(1, min(64, math.ceil(ROT_BYTES / self.case_bytes)))
        total = self.sets * b * self.nblk
        self.k_cache = torch.randint(-127, 128, (total, BS, KVH, D), dtype=torch.int8,
                                     device="cuda", generator=gen)
        self.v_cache = torch.randint(-127, 128, (total, BS, KVH, D), dtype=torch.int8,
                                     device="cuda", generator=gen)
        self.k_scale = torch.rand((total, BS, KVH), device="cuda", generator=gen) * 0.02 + 0.001
        self.v_scale = torch.rand((total, BS, KVH), device="cuda", generator=gen) * 0.02 + 0.001
        perm = torch.randperm(total, device="cuda", generator=gen).to(torch.int32)
        self.tables = perm.view(self.sets, b, self.nblk)
        self.lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
        self.qs = [torch.randn((b, H, D), device="cuda", generator=gen).to(torch.bfloat16)
                   for _ in range(self.sets)]
        self.outs = [torch.empty_like(q) for q in self.qs]
        # what one call reads and writes: K, V, scales, block table, seq_lens, query, output
        self.nbytes = self.case_bytes + 2 * b * H * D * 2 + b * self.nblk * 4 + b * 4

    def decode_fns(self, part_size: int | None = None) -> list:
        return [
            (lambda i=i: pthfa.decode(self.qs[i], self.k_cache, self.v_cache, self.k_scale,
                                      self.v_scale, self.tables[i], self.lens,
                                      max_seq_len=self.ctx, out=self.outs[i],
                                      part_size=part_size))
            for i in range(self.sets)
        ]


def bench_pthfa(b: int, ctx: int, gen: torch.Generator,
                part_size: int | None = None) -> tuple[float, float, int, str]:
    """(graph s, eager s, bytes, how the graph column was timed) per call."""
    x = Inputs(b, ctx, gen)
    fns = x.decode_fns(part_size)
    t, how = timed(fns)
    te, _ = timed(fns, graph=False)
    return t, te, x.nbytes, how


def bench_sdpa(b: int, ctx: int, gen: torch.Generator) -> tuple[float, float, int, str]:
    """(graph s, eager s, bytes, backends) of the fastest SDPA backend that runs, per mode.
    The backend is chosen once around the timing, so the eager column pays SDPA's own
    dispatch, not a context manager per call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    case_bytes = b * ctx * KVH * D * 2 * 2
    sets = max(1, min(64, math.ceil(ROT_BYTES / case_bytes)))
    k = torch.randn((sets, b, KVH, ctx, D), device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn((sets, b, KVH, ctx, D), device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn((sets, b, H, 1, D), device="cuda", generator=gen).to(torch.bfloat16)
    fns = [(lambda i=i: F.scaled_dot_product_attention(q[i], k[i], v[i], enable_gqa=True))
           for i in range(sets)]
    best: dict[str, tuple[float, str]] = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        if backend == SDPBackend.MATH and best:
            break  # the unfused fallback only where no fused backend ran
        try:
            with warnings.catch_warnings(), sdpa_kernel([backend]):
                warnings.simplefilter("ignore")
                times = {"graph": timed(fns)[0], "eager": timed(fns, graph=False)[0]}
        except RuntimeError:
            continue
        for mode, t in times.items():
            if mode not in best or t < best[mode][0]:
                best[mode] = (t, backend.name.lower())
    del fns
    k = v = q = torch.empty(0)  # free the GPU memory
    torch.cuda.empty_cache()
    nbytes = case_bytes + 2 * b * H * D * 2
    assert best, "no SDPA backend ran"
    names = best["graph"][1] if best["graph"][1] == best["eager"][1] else \
        f"{best['graph'][1]} / {best['eager'][1]}"
    return best["graph"][0], best["eager"][0], nbytes, names


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--ctx", default="1024,8192,32768")
    ap.add_argument("--impls", default="",
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
        "Eager: the calls in a Python loop, timed by CUDA events around it (host work included); "
        "graph: the same calls captured once and replayed. Speedup = SDPA / pthfa, same mode.",
        "",
        "| batch | context | kernel (part) | pthfa eager us | pthfa graph us | graph GB/s "
        "| % of copy BW | SDPA eager us | SDPA graph us | SDPA backend | eager speedup "
        "| graph speedup |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for b in (int(x) for x in args.batches.split(",")):
        for ctx in (int(x) for x in args.ctx.split(",")):
            tp, tpe, bp, howp = bench_pthfa(b, ctx, gen)
            torch.cuda.empty_cache()
            ts, tse, _bs, hows = bench_sdpa(b, ctx, gen)
            impl, part = _plan.plan(b, KVH, ctx, BS, H // KVH, D,
                                    props.multi_processor_count, props.major)
            row = (f"| {b} | {ctx} | {impl} ({part}) | {tpe * 1e6:.1f} | {tp * 1e6:.1f} | "
                   f"{bp / tp / 1e9:.0f} | {100 * bp / tp / bw:.0f}% | {tse * 1e6:.1f} | "
                   f"{ts * 1e6:.1f} | {hows} | {tse / tpe:.2f}x | {ts / tp:.2f}x |")
            lines.append(row)
            sys.stdout.write(row + f"  <!-- pthfa graph timing: {howp} -->\n")
            sys.stdout.flush()
    lines.append("")
    impls = [x for x in args.impls.split(",") if x]
    if impls:
        lines.append("Partition kernels, forced ($PTHFA_IMPL; auto partition size): graph us "
                     "(% of copy BW) / eager us:")
        lines.append("")
        lines.append("| batch | context | " + " | ".join(impls) + " |")
        lines.append("| ---: | ---: |" + " ---: |" * len(impls))
        for b in (int(x) for x in args.batches.split(",")):
            for ctx in (int(x) for x in args.ctx.split(",")):
                cells = []
                for impl in impls:
                    os.environ["PTHFA_IMPL"] = impl
                    _ops.reload_env()
                    try:
                        tp, te, bp, _ = bench_pthfa(b, ctx, gen)
                        cells.append(f"{tp * 1e6:.1f} ({100 * bp / tp / bw:.0f}%) / "
                                     f"{te * 1e6:.1f}")
                    except Exception as exc:
                        cells.append(f"failed: {type(exc).__name__}")
                    torch.cuda.empty_cache()
                lines.append(f"| {b} | {ctx} | " + " | ".join(cells) + " |")
                sys.stdout.write(lines[-1] + "\n")
        os.environ.pop("PTHFA_IMPL", None)
        _ops.reload_env()
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
                _ops.reload_env()
                try:
                    tp, _te, bp, _ = bench_pthfa(b, ctx, gen)
                    cells.append(f"{part}: {tp * 1e6:.1f} ({100 * bp / tp / bw:.0f}%)")
                except Exception as exc:
                    cells.append(f"{part}: failed: {type(exc).__name__}")
                torch.cuda.empty_cache()
            lines.append(f"- {impl} {b}x{ctx}: " + "; ".join(cells))
            sys.stdout.write(lines[-1] + "\n")
        os.environ.pop("PTHFA_IMPL", None)
        os.environ.pop("PTHFA_PART_SIZE", None)
        _ops.reload_env()
    text = "\n".join(lines) + "\n"
    sys.stdout.write("\n" + text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
