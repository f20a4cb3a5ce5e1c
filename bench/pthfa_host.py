#!/usr/bin/env python3
"""Host overhead of one eager pthfa call, next to torch's SDPA on the same tiny shape.

Wall time of ``--calls`` back-to-back calls (then one synchronize), divided by the count, on
a shape whose GPU time is negligible (1 sequence of 16 tokens, Qwen3-8B's heads): what each
layer of each decode step pays in Python and launch work when attention runs outside a
CUDA graph. Medians of ``--runs`` repetitions; ``--profile`` adds cProfile's top entries
for pthfa.decode.

Usage: PYTHONPATH=pthfa/python python3 bench/pthfa_host.py [--calls 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import cProfile
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
from pthfa import _launch as pthfa_launch

H, KVH, D, BS, TOKENS = 32, 8, 128, 16, 16


def per_call(fn: Any, calls: int, runs: int) -> float:
    """Median over ``runs`` of (wall time of ``calls`` calls + one sync) / ``calls``, in µs."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
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
    rows = {
        "pthfa.quantize_kv": per_call(quantize, args.calls, args.runs),
        "pthfa.decode": per_call(decode, args.calls, args.runs),
        "pthfa.decode, max_seq_len + 1 a call": per_call(decode_growing, args.calls, args.runs),
        "torch SDPA (bf16, eager)": per_call(sdpa, args.calls, args.runs),
        "floor: one torch launch (zero_)": per_call(one_torch_launch, args.calls, args.runs),
    }
    os.environ["PTHFA_LAUNCH"] = "cupy"
    pthfa_launch.reload_env()
    rows["pthfa.quantize_kv (CuPy launch)"] = per_call(quantize, args.calls, args.runs)
    rows["pthfa.decode (CuPy launch)"] = per_call(decode, args.calls, args.runs)
    del os.environ["PTHFA_LAUNCH"]
    pthfa_launch.reload_env()
    print(f"{torch.cuda.get_device_name()}: µs per call, {args.calls} calls back to back, "
          f"median of {args.runs}")
    for name, us in rows.items():
        print(f"{name:38} {us:8.1f} µs  {1e6 / us:10.0f} calls/s")
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
