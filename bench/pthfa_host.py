#!/usr/bin/env python3
"""Host overhead of one eager pthfa call, next to torch's SDPA on the same tiny shape.

Wall time of ``--calls`` back-to-back calls (then one synchronize), divided by the count, on
a shape whose GPU time is negligible (1 sequence of 16 tokens, Qwen3-8B's heads): what each
layer of each decode step pays in Python and launch work when attention runs outside a
CUDA graph. The functions are timed in ``--runs`` interleaved rounds (medians, with the
ratio to a floor measured in the same round: one kernel launched by torch), pinned to one CPU;
the GPU column is the same calls replayed from a CUDA graph, to show the wall time is host
time. ``--profile`` adds cProfile's top entries for pthfa.decode.

Usage: PYTHONPATH=pthfa/python python3 bench/pthfa_host.py [--calls 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pthfa" / "python"))
import pthfa
from pthfa import _ops

H, KVH, D, BS, TOKENS = 32, 8, 128, 16, 16


def per_call(fn: Any, calls: int) -> float:
    """(wall time of ``calls`` back-to-back calls + one sync) / ``calls``, in µs."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def gpu_per_call(fn: Any, calls: int = 200) -> float:
    """GPU time per call in µs: ``calls`` calls captured in one CUDA graph, replayed, timed by
    CUDA events (no host work): what the wall time would be bound by if the host were free."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def interleaved(fns: dict[str, Any], calls: int, runs: int) -> dict[str, list[float]]:
    """µs per call of every function, ``runs`` rounds, each round timing every function once
    in turn (so a slow spell of the machine hits all of them alike)."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    torch.cuda.synchronize()
    got: dict[str, list[float]] = {name: [] for name in fns}
    gc.disable()
    try:
        for _ in range(runs):
            for name, fn in fns.items():
                got[name].append(per_call(fn, calls))
    finally:
        gc.enable()
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin the process to one CPU")
    args = ap.parse_args()
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn((1, H, D), device=dev, generator=gen).to(torch.bfloat16)
    k = torch.randn((TOKENS, KVH, D), device=dev, generator=gen).to(torch.bfloat16)
    v = torch.randn((TOKENS, KVH, D), device=dev, generator=gen).to(torch.bfloat16)
    blocks = 256  # room for the growing max_seq_len below (seq_lens stays at 16)
    kc = torch.zeros((blocks, BS, KVH, D), dtype=torch.int8, device=dev)
    vc = torch.zeros_like(kc)
    ks = torch.zeros((blocks, BS, KVH), dtype=torch.float32, device=dev)
    vs = torch.zeros_like(ks)
    slots = torch.arange(TOKENS, dtype=torch.int64, device=dev)
    tables = torch.arange(blocks, dtype=torch.int32, device=dev).reshape(1, blocks)
    lens = torch.tensor([TOKENS], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    kb = k.transpose(0, 1).unsqueeze(0)
    vb = v.transpose(0, 1).unsqueeze(0)
    qb = q.unsqueeze(2)

    def quantize() -> None:
        pthfa.quantize_kv(k, v, kc, vc, ks, vs, slots)

    def decode() -> None:
        pthfa.decode(q, kc, vc, ks, vs, tables, lens, max_seq_len=TOKENS, out=out)

    grow = iter(range(10**9))

    def decode_growing() -> None:  # as in serving: the bound moves every step
        pthfa.decode(q, kc, vc, ks, vs, tables, lens, max_seq_len=TOKENS + next(grow) % 4000,
                     out=out)

    def sdpa() -> None:
        F.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True)

    def one_torch_launch() -> None:  # the floor: one kernel launched by torch, eager
        out.zero_()

    quantize()
    if args.pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {os.sched_getaffinity(0).pop()})  # one CPU: no migrations
    fns = {
        "pthfa.quantize_kv": quantize,
        "pthfa.decode": decode,
        "pthfa.decode, max_seq_len + 1 a call": decode_growing,
        "torch SDPA (bf16, eager)": sdpa,
        "floor: one torch launch (zero_)": one_torch_launch,
    }
    rows = interleaved(fns, args.calls, args.runs)
    os.environ["PTHFA_LAUNCH"] = "cupy"
    _ops.reload_env()
    rows.update(interleaved({"pthfa.quantize_kv (CuPy launch)": quantize,
                             "pthfa.decode (CuPy launch)": decode}, args.calls, args.runs))
    del os.environ["PTHFA_LAUNCH"]
    _ops.reload_env()
    floor = rows["floor: one torch launch (zero_)"]
    gpu = {"pthfa.quantize_kv": gpu_per_call(quantize), "pthfa.decode": gpu_per_call(decode),
           "torch SDPA (bf16, eager)": gpu_per_call(sdpa),
           "floor: one torch launch (zero_)": gpu_per_call(one_torch_launch)}
    print(f"{torch.cuda.get_device_name()}: µs per call, {args.calls} calls back to back; "
          f"median of {args.runs} interleaved rounds (min, max); x floor = the median of the "
          f"per-round ratios to one torch launch; GPU = graph replay of the same calls")
    for name, us in rows.items():
        ratio = statistics.median(u / f for u, f in zip(us, floor, strict=False))
        med = statistics.median(us)
        g = f"{gpu[name]:6.1f}" if name in gpu else "     -"
        print(f"{name:38} {med:7.1f} µs ({min(us):5.1f}, {max(us):5.1f})  x floor {ratio:4.2f}"
              f"  GPU {g} µs  {1e6 / med:8.0f} calls/s")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            decode()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
