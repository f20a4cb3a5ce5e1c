"""Paged-cache builders and an fp32 torch reference for the attention GPU tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PagedBatch:
    """A multi-query batch over a paged cache in vLLM's FLASH_ATTN layout."""

    q: torch.Tensor  # [tokens, Hq, D]
    kv_cache: torch.Tensor  # [num_blocks, Hkv, page, 2D], FLASH_ATTN's raw layout
    key_cache: torch.Tensor  # view [num_blocks, page, Hkv, D]
    value_cache: torch.Tensor  # view [num_blocks, page, Hkv, D]
    cu_seqlens_q: torch.Tensor  # [reqs + 1] int32
    seq_lens: torch.Tensor  # [reqs] int32
    block_table: torch.Tensor  # [reqs, max_blocks] int32
    q_lens: list[int]
    kv_lens: list[int]

    @property
    def max_q(self) -> int:
        return max(self.q_lens)

    @property
    def max_kv(self) -> int:
        return max(self.kv_lens)


def make_batch(q_lens: list[int], kv_lens: list[int], hq: int, hkv: int, d: int, page: int,
               dtype: torch.dtype, gen: torch.Generator, extra_blocks: int = 0,
               high_block: int | None = None, device: str = "cuda") -> PagedBatch:
    """Random Q and a cache whose blocks are handed out in a random order.

    ``high_block``: the pool has that many blocks and the last request's last block is the
    pool's last (to place a block id past a 2**31-byte offset)."""
    need = [-(-n // page) for n in kv_lens]
    total = sum(need) + extra_blocks
    nb = max(total, high_block or 0) + 1  # block 0 stays the null block
    kv_cache = torch.empty((nb, hkv, page, 2 * d), dtype=dtype, device=device)
    # fill in slabs: a whole 128k pool at once would double its memory in fp32
    for i in range(0, nb, 4096):
        sl = kv_cache[i:i + 4096]
        sl.copy_(torch.randn(sl.shape, generator=gen, device=device, dtype=torch.float32)
                 .to(dtype))
    key_cache, value_cache = kv_cache.transpose(1, 2).split(d, dim=-1)  # type: ignore[no-untyped-call,unused-ignore]
    ids = torch.randperm(nb - 1, generator=gen, device=device)[: sum(need)] + 1
    if high_block is not None:
        ids[-1] = nb - 1
    width = max(need)
    table = torch.zeros((len(q_lens), width), dtype=torch.int32, device=device)
    at = 0
    for r, n in enumerate(need):
        table[r, :n] = ids[at:at + n].to(torch.int32)
        at += n
    tokens = sum(q_lens)
    q = torch.randn((tokens, hq, d), generator=gen, device=device).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                      device=device)
    seq = torch.tensor(kv_lens, dtype=torch.int32, device=device)
    return PagedBatch(q, kv_cache, key_cache, value_cache, cu, seq, table, list(q_lens),
                      list(kv_lens))


def gather(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    """[n, Hkv, D] of one request, in position order."""
    page = cache.shape[1]
    pos = torch.arange(n, device=cache.device)
    blk = table_row.long()[pos // page]
    return cache[blk, pos % page]


def reference(b: PagedBatch, scale: float, k_deq: Any = None, v_deq: Any = None) -> torch.Tensor:
    """fp32 causal attention; query token i of a request sits at position kv_len - q_len + i.
    ``k_deq``/``v_deq``: callables (request index, n) -> [n, Hkv, D] fp32 replacing the gather
    (a quantised cache's dequantised values)."""
    out = torch.empty(b.q.shape, dtype=torch.float32, device=b.q.device)
    hq = b.q.shape[1]
    for r, (ql, kl) in enumerate(zip(b.q_lens, b.kv_lens, strict=True)):
        s0 = int(b.cu_seqlens_q[r])
        if ql == 0:
            continue
        k = k_deq(r, kl) if k_deq else gather(b.key_cache, b.block_table[r], kl).float()
        v = v_deq(r, kl) if v_deq else gather(b.value_cache, b.block_table[r], kl).float()
        g = hq // k.shape[1]
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        q = b.q[s0:s0 + ql].float()
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        qpos = torch.arange(kl - ql, kl, device=q.device)[:, None]
        kpos = torch.arange(kl, device=q.device)[None, :]
        s.masked_fill_((kpos > qpos)[None], float("-inf"))
        out[s0:s0 + ql] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def int4_cache(i4: Any, b: PagedBatch) -> Any:
    """Write the batch's bf16 K/V with vLLM's reshape_and_cache_int4 (``i4``: the tree's
    int4_per_token_head module) into 0.32.0's INT4_PER_TOKEN_HEAD layout: raw
    ``[blocks, Hkv, page, 2(D/2 + 4)]`` uint8, K/V views by transpose/split, fp32 scale views
    by ``as_strided`` as ``_ensure_scale_caches`` builds them."""
    dev = b.q.device
    nb, page, hkv, d = b.key_cache.shape
    half = d // 2 + 4
    raw = torch.zeros((nb, hkv, page, 2 * half), dtype=torch.uint8, device=dev)
    key, value = raw.transpose(1, 2).split(half, dim=-1)  # type: ignore[no-untyped-call,unused-ignore]
    f32 = torch.tensor([], dtype=torch.float32, device=dev).set_(raw.untyped_storage())
    st = raw.stride()
    view = dict(size=(nb, page, hkv), stride=(st[0] // 4, st[2] // 4, st[1] // 4))
    ks = torch.as_strided(f32, storage_offset=(d // 2) // 4, **view)
    vs = torch.as_strided(f32, storage_offset=(half + d // 2) // 4, **view)
    ks.fill_(1.0)
    vs.fill_(1.0)
    for r, n in enumerate(b.kv_lens):
        pos = torch.arange(n, device=dev)
        blk = b.block_table[r].long()[pos // page]
        slots = blk * page + pos % page
        src_k = b.key_cache[blk, pos % page].contiguous()
        src_v = b.value_cache[blk, pos % page].contiguous()
        i4.reshape_and_cache_int4(src_k, src_v, key, value, slots,
                                  k_scale_cache=ks, v_scale_cache=vs)
    return key, value, ks, vs


def bf16_agree(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest per-(token, head) row ||a - b|| / ||b||, asserted <= 2^-6: two bf16 outputs
    of one computation summed in another order and rounded twice (the int4 paths' kernel
    output, then the inverse rotation) agree to 2^-7 of the row norm."""
    num = (a.float() - b.float()).norm(dim=-1)
    den = b.float().norm(dim=-1).clamp_min(1e-6)
    worst = float((num / den).max())
    assert worst <= 2 ** -6, worst
    return worst
