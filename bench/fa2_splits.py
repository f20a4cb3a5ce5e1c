#!/usr/bin/env python3
"""FA2 split-KV decode time against the split count, fp8 and stock bf16, at small batches.

The library's own split count (fa2fp8_num_splits) is one rule for both kernels; this sweep
shows, per batch x context, what every split count would give each of them (the fp8 one
twice: its splits merged by the decode kernel's last split, and by FA2's combine kernel), so
the rule can be checked against the machine instead of a model (bench/fa2_fp8.py's shape and
timing: CUDA graph replays over rotating inputs, median of --reps, per call).

Usage: FA2FP8_LIB_DIR=DIR python3 bench/fa2_splits.py [--out table.md]
"""

from __future__ import annotations

import datetime
import math
import sys

import fa2_fp8 as fb  # (bench/, this script's folder, is on sys.path)
import torch

SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def main() -> int:
    args, grid = fb.parse_args("1x1024,1x4096,1x8192,2x8192,4x8192,8x8192,1x32768,8x32768")
    gen = torch.Generator(device=fb.DEV).manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    libs = {k: fb.fa2fp8.load(k, props.major, props.minor) for k in ("fp8", "stock")}
    lines = [f"Card: {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} "
             f"SMs), torch {torch.__version__}, {datetime.date.today().isoformat()}",
             f"Shape: {fb.H} query heads, {fb.KVH} KV heads, head_dim {fb.D}, block_size {fb.BS}; "
             f"us per call (graph replay, median of {args.reps}); * = the library's choice", "",
             "| batch x context | kernel | " + " | ".join(f"s={s}" for s in SPLITS) + " | best |",
             "|---|---|" + "---:|" * (len(SPLITS) + 1)]
    print("\n".join(lines), flush=True)
    for b, ctx in grid:
        for name in ("fp8", "fp8 combine kernel", "bf16"):
            fp8 = name.startswith("fp8")
            lib = libs["fp8" if fp8 else "stock"]
            chosen = int(lib.num_splits(b, fb.H, fb.KVH, fb.D, ctx))
            s = fb.Shape(b, ctx, 1 if fp8 else 2, gen)
            cells, best = [], (math.inf, 0)
            for n in SPLITS:
                if n > math.ceil(ctx / 64):  # a split with no key block
                    cells.append("")
                    continue
                fns, keep = fb.fa2_fns(s, fp8, gen, num_splits=n,
                                       combine_kernel=name == "fp8 combine kernel")
                t = fb.timed(fns, args.reps) * 1e6
                del fns, keep
                torch.cuda.empty_cache()
                best = min(best, (t, n))
                cells.append(f"{t:.1f}" + ("*" if n == chosen else ""))
            line = (f"| {b} x {ctx} | {name} | " + " | ".join(cells)
                    + f" | {best[0]:.1f} (s={best[1]}) |")
            lines.append(line)
            print(line, flush=True)
            del s
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
