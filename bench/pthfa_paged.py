#!/usr/bin/env python3
"""pthfa.decode over vLLM's pages (the PTHFA backend's layout) against its own contiguous
caches and torch's bf16 SDPA, in one run.

The backend's page of a block holds K, V, then the K and V scales; its views have blocks one
page apart (K/V rows 1 KiB apart inside a block, as in the contiguous cache). The same values
and block tables are timed both ways, in a CUDA graph and eagerly (bench/pthfa_decode.py's
timing and inputs), so the cost of the block stride shows directly.
Usage: PYTHONPATH=pthfa/python python3 bench/pthfa_paged.py [--out table.md] [--shapes 64x8192,...]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pthfa_decode as B

import pthfa


class Paged(B.Inputs):
    """The same inputs, copied into pages of 2 * BS * KVH * D + 8 * BS * KVH bytes."""

    def __init__(self, b: int, ctx: int, gen: torch.Generator) -> None:
        super().__init__(b, ctx, gen)
        nb, bs, h, d = self.k_cache.shape
        kv = bs * h * d
        page = 2 * kv + 8 * bs * h
        raw = torch.empty(nb * page, dtype=torch.int8, device="cuda")
        self.pk = raw.as_strided((nb, bs, h, d), (page, h * d, d, 1), 0)
        self.pv = raw.as_strided((nb, bs, h, d), (page, h * d, d, 1), kv)
        f32 = torch.empty(0, dtype=torch.float32, device="cuda").set_(raw.untyped_storage())
        self.pks = f32.as_strided((nb, bs, h), (page // 4, h, 1), 2 * kv // 4)
        self.pvs = f32.as_strided((nb, bs, h), (page // 4, h, 1), (2 * kv + 4 * bs * h) // 4)
        for dst, src in ((self.pk, self.k_cache), (self.pv, self.v_cache),
                         (self.pks, self.k_scale), (self.pvs, self.v_scale)):
            dst.copy_(src)
        self.raw = raw

    def paged_fns(self) -> list:
        return [(lambda i=i: pthfa.decode(self.qs[i], self.pk, self.pv, self.pks, self.pvs,
                                          self.tables[i], self.lens, max_seq_len=self.ctx,
                                          out=self.outs[i]))
                for i in range(self.sets)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="1x8192,8x8192,64x8192,64x32768")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    lines = [f"Card: {props.name} ({props.multi_processor_count} SMs), torch "
             f"{torch.__version__}, {datetime.date.today()}", "",
             "| batch | context | contiguous graph us | paged graph us | paged / contiguous "
             "| contiguous eager us | paged eager us | SDPA graph us | SDPA / paged (graph) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for shape in args.shapes.split(","):
        b, ctx = (int(x) for x in shape.split("x"))
        x = Paged(b, ctx, gen)
        # same numbers both ways
        for i in range(min(2, x.sets)):
            a = pthfa.decode(x.qs[i], x.k_cache, x.v_cache, x.k_scale, x.v_scale,
                             x.tables[i], x.lens, max_seq_len=ctx)
            p = pthfa.decode(x.qs[i], x.pk, x.pv, x.pks, x.pvs, x.tables[i], x.lens,
                             max_seq_len=ctx)
            assert torch.equal(a, p), f"{shape}: paged and contiguous results differ"
        tc, _ = B.timed(x.decode_fns())
        tp, _ = B.timed(x.paged_fns())
        tce, _ = B.timed(x.decode_fns(), graph=False)
        tpe, _ = B.timed(x.paged_fns(), graph=False)
        del x
        torch.cuda.empty_cache()
        ts, _, _, _ = B.bench_sdpa(b, ctx, gen)
        row = (f"| {b} | {ctx} | {tc * 1e6:.1f} | {tp * 1e6:.1f} | {tp / tc:.3f} | "
               f"{tce * 1e6:.1f} | {tpe * 1e6:.1f} | {ts * 1e6:.1f} | {ts / tp:.2f}x |")
        print(row, flush=True)
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
