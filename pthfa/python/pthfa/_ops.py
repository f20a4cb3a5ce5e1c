"""The public operations: quantize_kv and decode (the signature's cached checks and
plan, then prepacked driver launches; CuPy's kernel call the fallback), decode's
scratch, and reload_env."""

from __future__ import annotations

import math
import threading
from typing import Any

from . import _validate as V
from ._driver import (
    _DRIVER,
    _LOCK,
    _T,
    FMT_CP,
    FMT_QUANTIZE,
    _ArgBlock,
    _driver,
    _kernel,
    _Torch,
    _torch,
)
from ._knobs import _KNOBS
from ._plan import _PLANS, _plan_for
from ._signature import _DECODE_OK, _QUANTIZE_OK, _checked, _decode_key, _quantize_key

# Per (device, stream): the scratch of one decode, reused by every eager decode on that stream
# (stream order keeps one call's reads before the next call's writes): first the arrival
# counters of the fused reduce (zeroed once; every call leaves them at zero), then the partial
# results. (counters' address, counters it holds, scratch's address, scratch bytes, tensor).
_WORK: dict[tuple[int, int], tuple[int, int, int, int, Any]] = {}


def _workspace(t: _Torch, device: int, stream: int, counters: int, nbytes: int,
               capturing: bool) -> tuple[int, int, Any]:
    """(counters' address, scratch's address, owner) for one decode. Eager: the stream's
    cached buffer, grown as needed. While the stream captures a graph: a fresh allocation from
    the graph's pool, so a replay never shares its scratch with eager calls; a graph never
    takes the fused reduce, so it needs no counters (and no zeroing in every replay)."""
    buf: Any
    if capturing:
        buf = t.empty(nbytes, dtype=t.uint8, device=device)
        return 0, buf.data_ptr(), buf
    got = _WORK.get((device, stream))
    if got is not None and got[1] >= counters and got[3] >= nbytes:
        return got[0], got[2], got[4]
    if got is not None:  # grow both parts: the counters are laid out first
        counters = max(counters, got[1])
        nbytes = max(nbytes, got[3])
    head = (counters * 4 + 255) // 256 * 256
    size = max(nbytes, 1 << 16)
    buf = t.zeros(head + size, dtype=t.uint8, device=device)
    _WORK[(device, stream)] = (buf.data_ptr(), head // 4, buf.data_ptr() + head, size, buf)
    return buf.data_ptr(), buf.data_ptr() + head, buf


def reload_env() -> None:
    """Re-read the PTHFA_* knobs, and forget every plan and launch choice made from them."""
    with _LOCK:
        _KNOBS.clear()
        _DRIVER.clear()
        _PLANS.clear()
        _DECODE_OK.clear()
        _QUANTIZE_OK.clear()


def quantize_kv(key: Any, value: Any, k_cache: Any, v_cache: Any, k_scale: Any, v_scale: Any,
                slot_mapping: Any) -> None:
    """Quantize ``key``/``value`` [tokens, kv_heads, head_dim] into the paged int8 cache.

    Row ``slot_mapping[i]`` (= block * block_size + offset; negative skips the token) of the
    caches [num_blocks, block_size, kv_heads, head_dim] int8 gets token i, and the scales
    [num_blocks, block_size, kv_heads] fp32 get absmax / 127 of each (token, head) row.
    """
    sig = _checked(_QUANTIZE_OK, V.check_quantize, _quantize_key, key, value, k_cache, v_cache,
                   k_scale, v_scale, slot_mapping)
    p = sig.plans.get(())
    if p is None:
        a = sig.args
        warps = 2 * a.num_tokens * a.num_kv_heads
        kernel = (_kernel(a.device, f"pthfa_quantize_{a.dtype}_d{a.head_dim}", FMT_QUANTIZE)
                  if a.num_tokens else None)
        p = sig.plans[()] = (kernel, (max(1, math.ceil(warps / V.WARPS)), 1, 1),
                             (a.num_tokens, a.num_kv_heads, *a.key_strides, *a.value_strides,
                              a.block_shift, a.kv_bstride, a.sc_bstride),
                             {})
    kernel, grid, ints = p[0], p[1], p[2]
    blocks: dict[int, _ArgBlock] = p[3]
    if kernel is None:
        return
    t = _T[0] if _T else _torch()
    stream = t.stream(kernel.device)
    drv = _DRIVER[0] if _DRIVER else _driver()
    if drv is not None and t.device() == kernel.device:  # the hot path
        tid = threading.get_ident()
        blk = blocks.get(tid)
        if blk is None:
            blk = blocks[tid] = _ArgBlock(FMT_QUANTIZE, ints)
        blk.pack_head(key.data_ptr(), value.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                      k_scale.data_ptr(), v_scale.data_ptr(), slot_mapping.data_ptr())
        drv.launch(kernel.fn, grid[0], 1, 1, V.THREADS, 1, 1, 0, stream, blk.address, 0)
        return
    kernel.run(t, stream, grid, _THREADS3, (
        key.data_ptr(), value.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        k_scale.data_ptr(), v_scale.data_ptr(), slot_mapping.data_ptr(), *ints), 0)


_THREADS3 = (V.THREADS, 1, 1)


def decode(query: Any, k_cache: Any, v_cache: Any, k_scale: Any, v_scale: Any,
           block_tables: Any, seq_lens: Any, *, max_seq_len: int | None = None,
           sm_scale: float | None = None, out: Any = None, part_size: int | None = None) -> Any:
    """Decode attention: one query token per sequence over the paged int8 cache.

    query [num_seqs, num_heads, head_dim] bf16/fp16; block_tables [num_seqs, max_blocks]
    int32; seq_lens [num_seqs] int32 (0 gives a zero output row). ``max_seq_len`` bounds
    seq_lens (read from the device, one sync, when omitted). Returns ``out``
    [num_seqs, num_heads, head_dim], query's dtype.

    A repeat call with the same signature costs a dictionary lookup, the pointers and one
    driver launch (two past FUSE_BYTES): the checks and the plan are remembered.
    """
    sig = _checked(_DECODE_OK, V.check_decode, _decode_key, query, k_cache, v_cache, k_scale,
                   v_scale, block_tables, seq_lens, out)
    a = sig.args
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if a.num_seqs else 0
    last = sig.last
    if (last is not None and last[0] == max_seq_len and type(max_seq_len) is int
            and part_size is None and sm_scale is None):
        p = last[1]  # the same scalars as the call before (serving's common case)
    else:
        p = _plan_for(sig, max_seq_len, part_size, sm_scale)
    t = _T[0] if _T else _torch()
    if out is None:
        out = t.empty_like(query)
    if p.empty:
        return out
    dev = p.device
    stream = t.stream(dev)
    capturing = t.capturing()
    fused = p.counters and not capturing
    counters, work, _owner = _workspace(t, dev, stream, p.counters, p.work_bytes, capturing)
    part_ml = work + p.acc_bytes
    seq_ptr = seq_lens.data_ptr()
    drv = _DRIVER[0] if _DRIVER else _driver()
    if drv is not None and t.device() == dev:  # the hot path: prepacked driver launches
        blocks = p.blocks.get(threading.get_ident()) or p.thread_blocks()
        g = p.grid
        if fused:  # one launch: the partitions, reduced by the last CTA of each head
            blocks[0].pack_head(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                                k_scale.data_ptr(), v_scale.data_ptr(),
                                block_tables.data_ptr(), a.bt_stride, seq_ptr, part_ml, work,
                                out.data_ptr(), counters)
            drv.launch(p.part.fn, g[0], g[1], g[2], p.threads, 1, 1, p.smem, stream,
                       blocks[0].address, 0)
            return out
        if max_seq_len > 0:
            head = (query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                    k_scale.data_ptr(), v_scale.data_ptr(), block_tables.data_ptr(),
                    a.bt_stride, seq_ptr, part_ml, work)
            if p.fmt == FMT_CP:  # null out and counters: the partitions only
                blocks[0].pack_head(*head, 0, 0)
            else:
                blocks[0].pack_head(*head)
            drv.launch(p.part.fn, g[0], g[1], g[2], p.threads, 1, 1, p.smem, stream,
                       blocks[0].address, 0)
        blocks[1].pack_head(part_ml, work, seq_ptr, out.data_ptr())
        g = p.reduce_grid
        drv.launch(p.reduce.fn, g[0], g[1], g[2], a.head_dim, 1, 1, 0, stream,
                   blocks[1].address, 0)
        return out
    head = (query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_scale.data_ptr(),
            v_scale.data_ptr(), block_tables.data_ptr(), a.bt_stride, seq_ptr, part_ml, work)
    if fused:
        p.part.run(t, stream, p.grid, (p.threads, 1, 1),
                   (*head, out.data_ptr(), counters, *p.part_ints), p.smem)
        return out
    if max_seq_len > 0:
        extra = (0, 0) if p.fmt == FMT_CP else ()
        p.part.run(t, stream, p.grid, (p.threads, 1, 1), (*head, *extra, *p.part_ints),
                   p.smem)
    p.reduce.run(t, stream, p.reduce_grid, p.reduce_block,
                 (part_ml, work, seq_ptr, out.data_ptr(), *p.reduce_ints), 0)
    return out
