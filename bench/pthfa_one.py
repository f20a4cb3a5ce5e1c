#!/usr/bin/env python3
"""A few eager pthfa.decode calls at 64 x 8k then 64 x 32k: the program Nsight Compute
profiles in bench/gpu_session.sh (it picks the launches by name and count)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pthfa_decode import Inputs

gen = torch.Generator(device="cuda").manual_seed(0)
for b, ctx in ((64, 8192), (64, 32768)):
    x = Inputs(b, ctx, gen)
    for fn in x.decode_fns()[:5]:
        fn()
    torch.cuda.synchronize()
    del x
    torch.cuda.empty_cache()
