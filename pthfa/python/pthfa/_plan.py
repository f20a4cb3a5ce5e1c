"""What a decode launches: the partition kernel and its size (from the shape and
the knobs), and the plan per signature and bucket of max_seq_len (the loaded
kernels, grids, shared memory, scratch layout and integer arguments)."""

from __future__ import annotations

import math
import threading
from typing import Any

from . import _validate as V
from ._driver import FMT_CP, FMT_MMA, FMT_PART, FMT_REDUCE, FMT_WB, _ArgBlock, _kernel
from ._knobs import knobs
from ._signature import _Signature

IMPLS = ("simt", "mma1", "cp3", "cp4", "wb4", "wb5", "ws3", "ws6", "ws6p", "wt6")
WHOLE = ("wb", "ws", "wt")  # the whole-block kernels: one CTA per (partition, sequence)
SPLIT = ("ws", "wt")  # of them, the split ones (mbarrier-paced rings, many partitions)
DEFAULT = "cp3"
SPLIT_DEFAULT = "wt6"
SPLIT_MIN_TOKENS = 1 << 17  # sequences x max_seq_len from which SPLIT_DEFAULT is taken


def split_default(num_seqs: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                  block_size: int, sm_major: int) -> bool:
    """Whether the default dispatch takes SPLIT_DEFAULT (wt6) rather than cp3: on sm_90 and
    later (the bulk copy engine), for the shape it is built for (8 KV heads of 128 dims,
    blocks of 16 tokens or more), from 8 sequences of 2**17 tokens together, or 64 sequences
    of any length. On the H200 (results/2026-12-01-split-whole-block.md) wt6 was faster than
    cp3 on every benchmark shape of that region (8 x 32k, 16 x 8k and up, 64 x 1k) and
    slower on every one outside it (1 x any, 8 x 1k-8k, 16 x 1k, 32 x 1k)."""
    if sm_major < 9 or not V.wb_supported(num_kv_heads, head_dim, block_size):
        return False
    return num_seqs >= 64 or (num_seqs >= 8 and num_seqs * max_seq_len >= SPLIT_MIN_TOKENS)


def decode_impl(num_seqs: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                block_size: int, sm_major: int) -> str:
    """The partition kernel: $PTHFA_IMPL if set (one of IMPLS); else SPLIT_DEFAULT where
    :func:`split_default` says so; else the pipelined tensor-core kernel cp3, its partition
    size chosen by ``choose_part_size_cp``."""
    impl = knobs().impl
    if impl:
        if impl not in IMPLS:
            raise ValueError(f"PTHFA_IMPL must be one of {IMPLS}, got {impl!r}")
        return impl
    if split_default(num_seqs, num_kv_heads, max_seq_len, head_dim, block_size, sm_major):
        return SPLIT_DEFAULT
    return DEFAULT


_PLANS: dict[tuple[Any, ...], tuple[str, int]] = {}
_SMS: dict[int, int] = {}
_CAPS: dict[int, int] = {}


def _capability(device: int) -> int:
    """The device's compute capability major (9 for sm_90)."""
    c = _CAPS.get(device)
    if c is None:
        import torch

        c = _CAPS[device] = int(torch.cuda.get_device_capability(device)[0])
    return c


def _num_sms(device: int) -> int:
    n = _SMS.get(device)
    if n is None:
        import torch

        n = _SMS[device] = int(torch.cuda.get_device_properties(device).multi_processor_count)
    return n


def cached_plan(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_size: int,
                gqa: int, head_dim: int, num_sms: int, sm_major: int = 9) -> tuple[str, int]:
    """:func:`plan`, remembered per arguments (the knobs it reads are fixed until
    :func:`reload_env`, which forgets these)."""
    key = (num_seqs, num_kv_heads, max_seq_len, block_size, gqa, head_dim, num_sms, sm_major)
    got = _PLANS.get(key)
    if got is None:
        got = plan(num_seqs, num_kv_heads, max_seq_len, block_size, gqa, head_dim, num_sms,
                   sm_major)
        if len(_PLANS) < 4096:
            _PLANS[key] = got
    return got


def plan(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_size: int, gqa: int,
         head_dim: int, num_sms: int, sm_major: int = 9) -> tuple[str, int]:
    """(partition kernel, partition size) that ``decode`` uses when no part_size is given, on
    a device of ``num_sms`` SMs and compute capability ``sm_major``.x.

    ws/wt: ``choose_part_size_ws`` with their CTAs per SM; wb: ``choose_part_size_wb``;
    cp3/cp4: ``choose_part_size_cp`` with the CTAs per SM that their registers and shared
    memory allow; mma1: ``choose_part_size_mma``; simt: ``choose_part_size``.
    ``$PTHFA_PART_SIZE`` (a measurement knob) forces the partition size: any multiple of 16
    and of block_size, not only powers of two.
    """
    impl = decode_impl(num_seqs, num_kv_heads, max_seq_len, head_dim, block_size, sm_major)
    env_part = knobs().part_size
    if env_part:
        part = int(env_part)
        if part < 16 or part % 16 or part % block_size:
            raise ValueError(f"PTHFA_PART_SIZE must be a multiple of 16 and of block_size "
                             f"{block_size}, got {part}")
        return impl, part
    whole = impl.startswith(WHOLE) and V.wb_supported(num_kv_heads, head_dim, block_size)
    if whole and impl.startswith(SPLIT):
        part = V.choose_part_size_ws(num_seqs, max_seq_len, block_size, num_sms,
                                     V.WS_PER_SM[int(impl[2])])
    elif whole:
        part = V.choose_part_size_wb(num_seqs, max_seq_len, block_size, num_sms)
    elif impl.startswith(("cp",) + WHOLE):
        stages = int(impl[2:]) if impl.startswith("cp") else 3
        smem = V.smem_bytes_cp(2048, block_size, gqa, head_dim, stages)
        per_sm = max(1, min(3 if stages == 3 else 2, (228 << 10) // (smem + 1024)))
        part = V.choose_part_size_cp(num_seqs, num_kv_heads, max_seq_len, block_size, num_sms,
                                     per_sm)
    elif impl == "simt":
        part = V.choose_part_size(num_seqs, num_kv_heads, max_seq_len, block_size, gqa,
                                  head_dim, num_sms)
    else:
        part = V.choose_part_size_mma(num_seqs, num_kv_heads, max_seq_len, block_size, num_sms)
    return impl, part


def _bucket(n: int, cap: int) -> int:
    """``n`` rounded up to four significant bits (at most 12.5% more; never above ``cap``):
    the length a plan is made for. A decode's max_seq_len grows by one each step; plans per
    bucket keep the plan cache small and hit, and the partitions past a sequence's length
    return at once (the reduce reads only those its seq_len covers)."""
    if n <= 16:
        return n
    shift = n.bit_length() - 4
    return min((((n - 1) >> shift) + 1) << shift, cap)


class _DecodePlan:
    """Everything ``decode`` derives from a signature and its scalar arguments: the loaded
    kernels, grids, shared memory, scratch layout and the integer arguments."""

    __slots__ = (
        "acc_bytes",
        "blocks",
        "counters",
        "device",
        "empty",
        "fmt",
        "grid",
        "part",
        "part_ints",
        "reduce",
        "reduce_block",
        "reduce_grid",
        "reduce_ints",
        "smem",
        "threads",
        "work_bytes",
    )

    def __init__(self, a: Any, max_seq_len: int, part_size: int | None,
                 sm_scale: float | None) -> None:
        max_seq_len = V.check_max_seq_len(max_seq_len, a)
        if sm_scale is None:
            sm_scale = 1.0 / math.sqrt(a.head_dim)
        if not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool):
            raise TypeError(f"sm_scale must be a float, got {type(sm_scale).__name__}")
        self.device = a.device
        self.blocks: dict[int, tuple[_ArgBlock, _ArgBlock]] = {}
        self.empty = a.num_seqs == 0 or a.num_heads == 0
        if self.empty:
            return
        # the capability matters only where a whole-block kernel could run
        cap = (_capability(a.device)
               if V.wb_supported(a.num_kv_heads, a.head_dim, a.block_size) else 0)
        if part_size is None:
            impl, part_size = cached_plan(a.num_seqs, a.num_kv_heads, max_seq_len,
                                          a.block_size, a.gqa, a.head_dim, _num_sms(a.device),
                                          cap)
        else:
            V.check_part_size(part_size, a.block_size, a.gqa, a.head_dim)
            impl = decode_impl(a.num_seqs, a.num_kv_heads, max_seq_len, a.head_dim,
                               a.block_size, cap)
        if impl.startswith(WHOLE) and not V.wb_supported(a.num_kv_heads, a.head_dim,
                                                          a.block_size):
            impl = DEFAULT  # the whole-block kernels are built for 8 KV heads of 128 dims
        if impl.startswith("wt") and _capability(a.device) < 9:
            impl = "ws" + impl[2:]  # the bulk copy engine is sm_90's
        max_parts = max(1, math.ceil(max_seq_len / part_size))
        rows = a.num_seqs * a.num_heads * max_parts
        # the accumulators first, so both buffers start 256-byte aligned
        self.acc_bytes = rows * a.head_dim * 4
        self.work_bytes = rows * (a.head_dim + 2) * 4
        block_shift = a.block_size.bit_length() - 1
        scale_log2 = float(sm_scale) * math.log2(math.e)
        self.part_ints: tuple[Any, ...]
        self.grid = (max_parts, a.num_kv_heads, a.num_seqs)
        self.threads = V.THREADS
        if impl.startswith(WHOLE):
            name = f"pthfa_decode_{impl}_{a.dtype}_d{a.head_dim}_h{a.num_kv_heads}"
            self.fmt = FMT_WB  # ws and wt take wb's arguments
            self.grid = (max_parts, 1, a.num_seqs)
            # wt: a ninth warp, the producer
            self.threads = 32 * a.num_kv_heads + (32 if impl.startswith("wt") else 0)
            self.part_ints = (a.gqa, block_shift, part_size, max_parts, scale_log2,
                              a.kv_bstride, a.sc_bstride)
            self.smem = (V.smem_bytes_ws(part_size, a.block_size, int(impl[2]))
                         if impl.startswith(SPLIT) else
                         V.smem_bytes_wb(part_size, a.block_size, a.num_kv_heads, a.head_dim,
                                         int(impl[2:])))
        elif impl == "simt":
            name = f"pthfa_decode_part_{a.dtype}_d{a.head_dim}_g{a.gqa}"
            self.fmt = FMT_PART
            self.part_ints = (a.num_kv_heads, block_shift, part_size, max_parts, scale_log2,
                              a.kv_bstride, a.sc_bstride)
            self.smem = V.smem_bytes(part_size, a.block_size, a.gqa, a.head_dim)
        else:
            name = f"pthfa_decode_{impl}_{a.dtype}_d{a.head_dim}"
            self.fmt = FMT_CP if impl.startswith("cp") else FMT_MMA
            self.part_ints = (a.num_kv_heads, a.gqa, block_shift, part_size, max_parts,
                              scale_log2, a.kv_bstride, a.sc_bstride)
            self.smem = (V.smem_bytes_cp(part_size, a.block_size, a.gqa, a.head_dim,
                                         int(impl[2:]))
                         if impl.startswith("cp") else
                         V.smem_bytes_mma(part_size, a.block_size, a.gqa, a.head_dim))
        self.part = _kernel(a.device, name, self.fmt, self.smem)
        self.reduce = _kernel(a.device, f"pthfa_decode_reduce_{a.dtype}_d{a.head_dim}",
                              FMT_REDUCE)
        self.reduce_grid = (a.num_heads, a.num_seqs, 1)
        self.reduce_block = (a.head_dim, 1, 1)
        self.reduce_ints = (a.num_heads, part_size, max_parts)
        # cp3/cp4 can reduce in their last CTA of each (sequence, kv head): one launch. That
        # is for eager calls small enough to be bound by the host's launches; in a graph, or
        # past FUSE_BYTES, the reduce kernel (wide) costs less than the last CTAs' merge
        # (serial, holding an SM slot each): measured in results/2026-11-30-fused-reduce.md.
        cache_bytes = a.num_seqs * max_seq_len * a.num_kv_heads * (2 * a.head_dim + 8)
        self.counters = (a.num_seqs * a.num_kv_heads
                         if self.fmt == FMT_CP and cache_bytes <= FUSE_BYTES else 0)


    def thread_blocks(self) -> tuple[_ArgBlock, _ArgBlock]:
        """This thread's argument blocks of the two kernels, their fixed tails written."""
        tid = threading.get_ident()
        got = self.blocks.get(tid)
        if got is None:
            got = self.blocks[tid] = (_ArgBlock(self.fmt, self.part_ints),
                                      _ArgBlock(FMT_REDUCE, self.reduce_ints))
        return got


def _plan_for(sig: _Signature, max_seq_len: Any, part_size: Any, sm_scale: Any) -> Any:
    """decode's plan for these scalars: cached per bucket of max_seq_len when they are plain
    ints and floats in range; else made (the full checks name what is wrong)."""
    cap = sig.cap
    if (type(max_seq_len) is int and 0 <= max_seq_len <= cap
            and (part_size is None or type(part_size) is int)
            and (sm_scale is None or type(sm_scale) is float or type(sm_scale) is int)):
        key = (_bucket(max_seq_len, cap), part_size, sm_scale)
        p = sig.plans.get(key)
        if p is None:
            p = _DecodePlan(sig.args, key[0], part_size, sm_scale)
            if len(sig.plans) < 512:
                sig.plans[key] = p
        if part_size is None and sm_scale is None:
            sig.last = (max_seq_len, p)
        return p
    return _DecodePlan(sig.args, max_seq_len, part_size, sm_scale)


FUSE_BYTES = 32 << 20  # K, V and scales a decode reads, at most, to reduce in its last CTAs
