"""float64 torch references for the tests and the benchmark (torch needed, no CuPy)."""

from __future__ import annotations

import math
from typing import Any


def quantize_ref(x: Any) -> tuple[Any, Any]:
    """[..., head_dim] float -> (int8 values, fp32 scale per row), the kernel's formula."""
    import torch

    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.clamp(torch.round(xf * inv[..., None]), -127, 127).to(torch.int8)
    return q, scale


def gather_kv(cache: Any, scale: Any, block_table_row: Any, seq_len: int) -> Any:
    """Dequantized [seq_len, kv_heads, head_dim] float64 rows of one sequence."""
    bs = cache.shape[1]
    nblk = -(-seq_len // bs)
    blocks = block_table_row[:nblk].long()
    rows = cache[blocks].double() * scale[blocks].double()[..., None]  # [nblk, bs, kvh, d]
    return rows.reshape(-1, cache.shape[2], cache.shape[3])[:seq_len]


def attention_ref(query: Any, keys: list[Any], values: list[Any],
                  sm_scale: float | None = None) -> Any:
    """float64 attention of query [S, H, D] over per-sequence K/V [L_i, kvh, D] (GQA)."""
    import torch

    s, h, d = query.shape
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(d)
    out = torch.zeros((s, h, d), dtype=torch.float64, device=query.device)
    for i in range(s):
        k, v = keys[i].double(), values[i].double()
        if k.shape[0] == 0:
            continue
        g = h // k.shape[1]
        k = k.repeat_interleave(g, dim=1)  # [L, H, D]
        v = v.repeat_interleave(g, dim=1)
        qf = query[i].double()  # [H, D]
        logits = torch.einsum("hd,lhd->hl", qf, k) * sm_scale
        p = torch.softmax(logits, dim=-1)
        out[i] = torch.einsum("hl,lhd->hd", p, v)
    return out
