#!/usr/bin/env python3
"""Where pthfa's decode time goes at large shapes, against the card's own read ceiling.

Builds the probe cubin (``decode.cu`` with ``PTHFA_PROBES``: probes never ship) with the
system nvcc, then times by CUDA-graph replay, medians of CUDA events:

- ``read``: the read ceiling, one 16-byte load per thread over a 4 GiB buffer;
- ``cp3``: the partition kernel alone (no reduce), as ``pthfa.decode`` plans it;
- ``probe1``: the same loads, waits and grid, no math: the floor of cp3's access pattern;
- ``probe2``: cp3 without its scale loads: what the scattered 4-byte scales cost;
- ``probe3``: cp3 with the kv heads fastest in the grid (heads of one token side by side);
- ``probe4``, ``probe5``: probe1 and cp3 over a head-major cache [block, kv head, offset]
  (the same bytes; a head's 16 rows of a block are 2 KiB in one piece, not 128 B pieces
  1 KiB apart as in vLLM's [block, offset, kv head]);
- ``decode``: pthfa.decode (the partitions and, in their last CTAs, the reduce);
  ``sdpa``: torch's bf16 SDPA (fastest backend).

Each row: µs, GB/s of the bytes pthfa must read (int8 K and V, fp32 scales), % of the read
ceiling, and SDPA's time over the row's. The ceiling for int8 is SDPA / (bytes / read BW).
Usage: PYTHONPATH=pthfa/python:. python3 bench/pthfa_roofline.py [--shapes 64x8192,64x32768]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_probes(dest: Path) -> None:
    """The probe cubin for this GPU, into ``dest`` (what PTHFA_CUBIN_DIR then points at)."""
    import torch

    from qwen38build.kernels.kernels import compile_arch

    major, minor = torch.cuda.get_device_capability()
    src = dest / "src"
    src.mkdir(parents=True)
    for f in (ROOT / "pthfa" / "csrc").iterdir():
        shutil.copyfile(f, src / f.name)
    dec = src / "decode.cu"
    dec.write_text("#define PTHFA_PROBES 1\n" + dec.read_text())
    compile_arch(sorted(src.iterdir()), f"{major}.{minor}", dest)


def read_ceiling(dev: int, sms: int) -> float:
    """Bytes per second of pthfa_probe_read over a 4 GiB buffer (graph replay, median)."""
    import torch
    from pthfa_decode import timed

    from pthfa import _driver

    buf = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    args = (buf.data_ptr(), buf.numel() // 16, sink.data_ptr())
    t, _ = timed([lambda: _driver._launch(dev, "pthfa_probe_read", "QqQ", (sms * 16, 1, 1),
                                          (256, 1, 1), args)], reps=20)
    return buf.numel() / t


def probe_shape(b: int, ctx: int, read_bw: float, sms: int, gen: object) -> list[str]:
    """The table of one shape (see the module's docstring)."""
    import torch
    from pthfa_decode import bench_sdpa

    rows, case_bytes = time_pthfa(b, ctx, read_bw, sms, gen)
    torch.cuda.empty_cache()  # pthfa's inputs are gone: room for SDPA's bf16 copies
    t_sdpa, _te, _nb, backend = bench_sdpa(b, ctx, gen)
    rows.append((f"SDPA bf16 ({backend})", t_sdpa))
    lines = [f"{b} x {ctx} (int8 K+V and scales: {case_bytes / 2**20:.0f} MiB a call):", "",
             "| step | us | GB/s of the int8 bytes | % of read ceiling | SDPA / this |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, t in rows:
        lines.append(f"| {name} | {t * 1e6:.1f} | {case_bytes / t / 1e9:.0f} | "
                     f"{100 * case_bytes / t / read_bw:.0f}% | {t_sdpa / t:.2f}x |")
    return [*lines, ""]


def time_pthfa(b: int, ctx: int, read_bw: float, sms: int,
               gen: object) -> tuple[list[tuple[str, float]], int]:
    """(step, seconds) of the ceiling, the partition kernel, the probes and decode."""
    import torch
    from pthfa_decode import BS, KVH, D, H, Inputs, timed

    from pthfa import _driver
    from pthfa import _validate as V

    dev = torch.cuda.current_device()
    x = Inputs(b, ctx, gen)
    # cp3's plan (the probes are cp3's access pattern), whatever the dispatch picks
    impl, part = "cp3", V.choose_part_size_cp(b, KVH, ctx, BS, sms)
    parts = math.ceil(ctx / part)
    work = torch.empty(b * H * parts * (D + 2) * 4, dtype=torch.uint8, device="cuda")
    acc = b * H * parts * D * 4
    smem = V.smem_bytes_cp(part, BS, H // KVH, D, 3)
    scale = (1 / math.sqrt(D)) * math.log2(math.e)

    def part_fns(name: str, heads_first: bool = False) -> list:
        """The partition kernel alone: the production one with null out and counters (no
        fused reduce), the probes with their own signature (no such arguments)."""
        g = (KVH, parts, b) if heads_first else (parts, KVH, b)
        # the probes take no block strides (they read a contiguous cache)
        fmt, extra, tail = ((_driver.FMT_MMA[:-2], (), ()) if "probe" in name else
                            (_driver.FMT_CP, (0, 0), (BS * KVH * D, BS * KVH)))
        return [(lambda i=i: _driver._launch(
            dev, name, fmt, g, (V.THREADS, 1, 1),
            (x.qs[i].data_ptr(), x.k_cache.data_ptr(), x.v_cache.data_ptr(),
             x.k_scale.data_ptr(), x.v_scale.data_ptr(), x.tables[i].data_ptr(), x.nblk,
             x.lens.data_ptr(), work.data_ptr() + acc, work.data_ptr(), *extra, KVH, H // KVH,
             int(math.log2(BS)), part, parts, scale, *tail), shared_mem=smem))
            for i in range(x.sets)]

    rows = [("read ceiling", x.case_bytes / read_bw),
            (f"{impl} ({part}), partition kernel",
             timed(part_fns(f"pthfa_decode_{impl}_bf16_d{D}"))[0]),
            ("probe1: loads only", timed(part_fns("pthfa_probe1_cp3_bf16_d128"))[0]),
            ("probe2: no scale loads", timed(part_fns("pthfa_probe2_cp3_bf16_d128"))[0]),
            ("probe3: kv heads fastest",
             timed(part_fns("pthfa_probe3_cp3_bf16_d128", heads_first=True))[0]),
            ("probe4: loads only, head-major blocks",
             timed(part_fns("pthfa_probe4_cp3_bf16_d128"))[0]),
            ("probe5: cp3, head-major blocks", timed(part_fns("pthfa_probe5_cp3_bf16_d128"))[0]),
            ("pthfa.decode (partitions, reduce fused)", timed(x.decode_fns())[0])]
    return rows, x.case_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x8192,64x32768")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pthfa-probes-"))
    build_probes(tmp)
    os.environ["PTHFA_CUBIN_DIR"] = str(tmp)
    sys.path.insert(0, str(ROOT / "bench"))
    import torch

    from pthfa import _ops

    _ops.reload_env()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    sms = props.multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    read_bw = read_ceiling(torch.cuda.current_device(), sms)
    torch.cuda.empty_cache()
    lines = [f"Card: {props.name}, torch {torch.__version__}; read ceiling "
             f"(pthfa_probe_read, 4 GiB): {read_bw / 1e9:.0f} GB/s", ""]
    for shape in args.shapes.split(","):
        b, ctx = (int(v) for v in shape.split("x"))
        table = probe_shape(b, ctx, read_bw, sms, gen)
        sys.stdout.write("\n".join(table) + "\n")
        sys.stdout.flush()
        lines += table
    text = "\n".join(lines) + "\n"
    sys.stdout.write("\n" + text)
    if args.out:
        args.out.write_text(text)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
