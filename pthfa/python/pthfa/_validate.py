"""Argument checks for the pthfa launchers. Pure Python: no torch, no CuPy, no GPU needed.

Tensors are read by duck typing (``shape``, ``dtype``, ``device``, ``stride()``,
``is_contiguous()``), so these checks run on stand-ins in CPU-only tests. Wrong types raise
TypeError, wrong shapes/dtypes/devices/layouts ValueError; each message names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HEAD_DIMS = (64, 128, 256)
GQA_RATIOS = (1, 2, 4, 8)
FLOAT_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
THREADS = 128
WARPS = THREADS // 32
SMEM_DEFAULT = 48 * 1024  # above this a launch must raise the dynamic limit
SMEM_LIMIT = 227 * 1024  # sm_80/sm_90 opt-in maximum per block


def _is_tensor(x: Any) -> bool:
    return all(hasattr(x, a) for a in ("shape", "dtype", "device", "stride", "is_contiguous"))


def _tensor(name: str, x: Any) -> Any:
    if not _is_tensor(x):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def _dtype(x: Any) -> str:
    return str(x.dtype)


def _device(x: Any) -> tuple[str, int | None]:
    dev = x.device
    return str(dev.type), (None if dev.index is None else int(dev.index))


def _ndim(name: str, x: Any, n: int, what: str) -> tuple[int, ...]:
    shp = _shape(x)
    if len(shp) != n:
        raise ValueError(f"{name} must be {n}-D {what}, got shape {list(shp)}")
    return shp


def _want_dtype(name: str, x: Any, *dtypes: str) -> None:
    if _dtype(x) not in dtypes:
        raise ValueError(f"{name} must have dtype {' or '.join(dtypes)}, got {_dtype(x)}")


def _contig(name: str, x: Any) -> None:
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous()), got strides "
                         f"{list(x.stride())}")


def _same_device(named: dict[str, Any]) -> int:
    first_name, first = next(iter(named.items()))
    dev = _device(first)
    if dev[0] != "cuda":
        raise ValueError(f"{first_name} must be on a CUDA device, got {dev[0]}")
    for name, x in named.items():
        d = _device(x)
        if d != dev:
            raise ValueError(
                f"{name} is on {d[0]}:{d[1]} but {first_name} is on {dev[0]}:{dev[1]}; "
                "all tensors must be on one CUDA device"
            )
    return dev[1] or 0


def _block_stride(name: str, x: Any, inner: tuple[int, ...], align: int) -> int:
    """The stride between blocks of a paged cache whose every block is contiguous inside
    (strides ``inner`` for the dimensions after the first): vLLM's cache is such a view when
    a block's page holds more than this one tensor. The stride must leave the blocks apart
    (at least a block) and keep each block ``align``-element aligned."""
    st = tuple(int(v) for v in x.stride())
    shp = _shape(x)
    if st[1:] != inner and not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous inside each block (strides "
                         f"{list(inner)} after the first), got strides {list(st)}")
    span = 1
    for n in shp[1:]:
        span *= n
    if shp[0] <= 1 or x.is_contiguous():
        return span
    if st[0] < span or st[0] % align:
        raise ValueError(f"{name}'s block stride {st[0]} must be at least a block ({span}) "
                         f"and a multiple of {align}")
    return st[0]


def _cache_pair(k_cache: Any, v_cache: Any, k_scale: Any,
                v_scale: Any) -> tuple[tuple[int, ...], int, int]:
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k_scale", k_scale),
                    ("v_scale", v_scale)):
        _tensor(name, x)
    shp = _ndim("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    if _shape(v_cache) != shp:
        raise ValueError(f"v_cache has shape {list(_shape(v_cache))}, k_cache {list(shp)}; "
                         "they must match")
    _want_dtype("k_cache", k_cache, "torch.int8")
    _want_dtype("v_cache", v_cache, "torch.int8")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if _shape(s) != shp[:3]:
            raise ValueError(f"{name} must have shape [num_blocks, block_size, num_kv_heads] = "
                             f"{list(shp[:3])}, got {list(_shape(s))}")
        _want_dtype(name, s, "torch.float32")
    _nb, bs, kvh, d = shp
    kvb = _block_stride("k_cache", k_cache, (kvh * d, d, 1), 16)
    if _block_stride("v_cache", v_cache, (kvh * d, d, 1), 16) != kvb:
        raise ValueError(f"v_cache's strides {list(v_cache.stride())} differ from k_cache's "
                         f"{list(k_cache.stride())}")
    scb = _block_stride("k_scale", k_scale, (kvh, 1), 1)
    if _block_stride("v_scale", v_scale, (kvh, 1), 1) != scb:
        raise ValueError(f"v_scale's strides {list(v_scale.stride())} differ from k_scale's "
                         f"{list(k_scale.stride())}")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {list(HEAD_DIMS)}, got {d}")
    if bs <= 0 or bs & (bs - 1) or bs > 512:
        raise ValueError(f"block_size must be a power of two up to 512, got {bs}")
    return shp, kvb, scb


@dataclass(frozen=True)
class QuantizeArgs:
    device: int
    dtype: str  # "bf16" or "fp16"
    num_tokens: int
    num_kv_heads: int
    head_dim: int
    key_strides: tuple[int, int]
    value_strides: tuple[int, int]
    block_shift: int = 0
    kv_bstride: int = 0  # bytes between the blocks of k_cache and v_cache
    sc_bstride: int = 0  # floats between the blocks of k_scale and v_scale


def check_quantize(key: Any, value: Any, k_cache: Any, v_cache: Any, k_scale: Any,
                   v_scale: Any, slot_mapping: Any) -> QuantizeArgs:
    """Validate :func:`pthfa.quantize_kv`'s arguments; return the launch dimensions."""
    _tensor("key", key)
    _tensor("value", value)
    _tensor("slot_mapping", slot_mapping)
    shp, kvb, scb = _cache_pair(k_cache, v_cache, k_scale, v_scale)
    kshape = _ndim("key", key, 3, "[num_tokens, num_kv_heads, head_dim]")
    if _shape(value) != kshape:
        raise ValueError(f"value has shape {list(_shape(value))}, key {list(kshape)}; "
                         "they must match")
    if kshape[1:] != shp[2:]:
        raise ValueError(f"key's [num_kv_heads, head_dim] = {list(kshape[1:])} does not match "
                         f"the cache's {list(shp[2:])}")
    if _dtype(key) not in FLOAT_DTYPES:
        raise ValueError(f"key must have dtype torch.bfloat16 or torch.float16, got {_dtype(key)}")
    if _dtype(value) != _dtype(key):
        raise ValueError(f"value has dtype {_dtype(value)}, key {_dtype(key)}; they must match")
    for name, x in (("key", key), ("value", value)):
        if kshape[2] > 1 and int(x.stride()[2]) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got "
                             f"strides {list(x.stride())}")
    _ndim("slot_mapping", slot_mapping, 1, "[num_tokens]")
    if _shape(slot_mapping)[0] != kshape[0]:
        raise ValueError(f"slot_mapping has {_shape(slot_mapping)[0]} entries for "
                         f"{kshape[0]} tokens")
    _want_dtype("slot_mapping", slot_mapping, "torch.int64")
    _contig("slot_mapping", slot_mapping)
    dev = _same_device({"key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache,
                        "k_scale": k_scale, "v_scale": v_scale, "slot_mapping": slot_mapping})
    ks, vs = key.stride(), value.stride()
    return QuantizeArgs(dev, FLOAT_DTYPES[_dtype(key)], kshape[0], kshape[1], kshape[2],
                        (int(ks[0]), int(ks[1])), (int(vs[0]), int(vs[1])),
                        shp[1].bit_length() - 1, kvb, scb)


@dataclass(frozen=True)
class DecodeArgs:
    device: int
    dtype: str
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    max_blocks: int
    bt_stride: int
    kv_bstride: int = 0  # bytes between the blocks of k_cache and v_cache
    sc_bstride: int = 0  # floats between the blocks of k_scale and v_scale

    @property
    def gqa(self) -> int:
        return self.num_heads // self.num_kv_heads


def check_decode(query: Any, k_cache: Any, v_cache: Any, k_scale: Any, v_scale: Any,
                 block_tables: Any, seq_lens: Any, out: Any = None) -> DecodeArgs:
    """Validate :func:`pthfa.decode`'s arguments; return the launch dimensions."""
    _tensor("query", query)
    _tensor("block_tables", block_tables)
    _tensor("seq_lens", seq_lens)
    (_nb, bs, kvh, d), kvb, scb = _cache_pair(k_cache, v_cache, k_scale, v_scale)
    s, h, qd = _ndim("query", query, 3, "[num_seqs, num_heads, head_dim]")
    if qd != d:
        raise ValueError(f"query's head_dim {qd} does not match the cache's {d}")
    if _dtype(query) not in FLOAT_DTYPES:
        raise ValueError(
            f"query must have dtype torch.bfloat16 or torch.float16, got {_dtype(query)}")
    _contig("query", query)
    if h % kvh:
        raise ValueError(f"num_heads {h} is not a multiple of num_kv_heads {kvh}")
    if h // kvh not in GQA_RATIOS:
        raise ValueError(f"num_heads / num_kv_heads = {h // kvh} is not supported; "
                         f"supported GQA ratios: {list(GQA_RATIOS)}")
    bt = _ndim("block_tables", block_tables, 2, "[num_seqs, max_blocks]")
    if bt[0] != s:
        raise ValueError(f"block_tables has {bt[0]} rows for {s} sequences")
    _want_dtype("block_tables", block_tables, "torch.int32")
    if bt[1] > 1 and int(block_tables.stride()[1]) != 1:
        raise ValueError("block_tables' last dimension must be contiguous (stride 1), got "
                         f"strides {list(block_tables.stride())}")
    sl = _ndim("seq_lens", seq_lens, 1, "[num_seqs]")
    if sl[0] != s:
        raise ValueError(f"seq_lens has {sl[0]} entries for {s} sequences")
    _want_dtype("seq_lens", seq_lens, "torch.int32")
    _contig("seq_lens", seq_lens)
    named = {"query": query, "k_cache": k_cache, "v_cache": v_cache, "k_scale": k_scale,
             "v_scale": v_scale, "block_tables": block_tables, "seq_lens": seq_lens}
    if out is not None:
        _tensor("out", out)
        if _shape(out) != (s, h, d):
            raise ValueError(f"out must have shape {[s, h, d]}, got {list(_shape(out))}")
        if _dtype(out) != _dtype(query):
            raise ValueError(f"out has dtype {_dtype(out)}, query {_dtype(query)}; "
                             "they must match")
        _contig("out", out)
        named["out"] = out
    dev = _same_device(named)
    bt_stride = int(block_tables.stride()[0]) if bt[0] > 0 else bt[1]
    return DecodeArgs(dev, FLOAT_DTYPES[_dtype(query)], s, h, kvh, d, bs, bt[1], bt_stride,
                      kvb, scb)


def smem_bytes(part_size: int, block_size: int, gqa: int, head_dim: int) -> int:
    """Dynamic shared memory of the partition kernel (must match decode.cu)."""
    bt_cap = ((part_size // block_size) + 3) & ~3
    return 4 * (bt_cap + max(part_size * gqa, WARPS * gqa * head_dim))


def smem_bytes_mma(part_size: int, block_size: int, gqa: int, head_dim: int) -> int:
    """Dynamic shared memory of the tensor-core partition kernel (must match decode.cu):
    the block-table slice, (m, l) of 8 rows per warp, and each warp's [gqa, head_dim] output."""
    bt_cap = ((part_size // block_size) + 3) & ~3
    return 4 * (bt_cap + WARPS * 16 + WARPS * gqa * head_dim)


def smem_bytes_cp(part_size: int, block_size: int, gqa: int, head_dim: int, stages: int) -> int:
    """Dynamic shared memory of the pipelined tensor-core kernel cp<stages> (must match
    decode.cu's CpLayout): the block-table slice, (m, l) of 8 rows per warp, then each warp's
    ring of ``stages`` steps (16 K rows and 16 V rows padded to head_dim + 16 bytes, 32
    scales), which the merge of the warps reuses (it is larger than [WARPS, gqa, head_dim]
    fp32)."""
    bt_cap = ((part_size // block_size) + 3) & ~3
    stage = 32 * (head_dim + 16) + 2 * 16 * 4
    return 4 * (bt_cap + WARPS * 16) + max(WARPS * stages * stage, 4 * WARPS * gqa * head_dim)


def wb_supported(num_kv_heads: int, head_dim: int, block_size: int) -> bool:
    """The whole-block kernel is built for 8 KV heads (one warp each) of 128 dims, and takes
    16-token steps inside one block."""
    return num_kv_heads == 8 and head_dim == 128 and block_size >= 16


def smem_bytes_wb(part_size: int, block_size: int, num_kv_heads: int, head_dim: int,
                  stages: int) -> int:
    """Dynamic shared memory of the whole-block kernel wb<stages> (must match decode.cu): the
    block-table slice, then ``stages`` stages of every head's cp3 stage."""
    bt_cap = ((part_size // block_size) + 3) & ~3
    stage = 32 * (head_dim + 16) + 2 * 16 * 4
    return 4 * bt_cap + stages * num_kv_heads * stage


def choose_part_size_wb(num_seqs: int, max_seq_len: int, block_size: int,
                        num_sms: int) -> int:
    """For the whole-block kernel (one CTA of 8 warps per SM): the shortest power-of-two
    partition (16 up to 65536 tokens, never below block_size) that keeps the grid within one
    wave of CTAs."""
    p = max(16, block_size)
    while p < 65536 and num_seqs * -(-max(max_seq_len, 1) // p) > num_sms:
        p *= 2
    return p


WS_STAGE = 2 * 16 * 8 * 128 + 2 * 16 * 8 * 4  # a 16-token step of 8 heads: K, V, scales
WS_PER_SM = {3: 2, 6: 1}  # CTAs per SM of ws<stages> (shared memory, 256 threads' registers)
WS_MAX_PART = 16384  # keeps ws3's block-table slice small enough for 2 CTAs per SM


def smem_bytes_ws(part_size: int, block_size: int, stages: int) -> int:
    """Dynamic shared memory of the split whole-block kernel ws<stages> (must match decode.cu's
    WsLayout): 128 bytes of mbarriers, ``stages`` unpadded steps of 8 heads x 16 tokens (K,
    V, then the scales), the block-table slice."""
    bt_cap = ((part_size // block_size) + 3) & ~3
    return 128 + stages * WS_STAGE + 4 * bt_cap


def choose_part_size_ws(num_seqs: int, max_seq_len: int, block_size: int, num_sms: int,
                        ctas_per_sm: int) -> int:
    """For the split whole-block kernel: cp3's cost model (``choose_part_size_cp``) with one
    CTA per (partition, sequence) for all 8 KV heads, ``ctas_per_sm`` resident, partitions
    up to WS_MAX_PART tokens."""
    return choose_part_size_cp(num_seqs, 1, max_seq_len, block_size, num_sms, ctas_per_sm,
                               longest=WS_MAX_PART)


def check_part_size(part_size: Any, block_size: int, gqa: int, head_dim: int) -> int:
    if not isinstance(part_size, int) or isinstance(part_size, bool):
        raise TypeError(f"part_size must be an int, got {type(part_size).__name__}")
    if part_size < 16 or part_size & (part_size - 1):
        raise ValueError(f"part_size must be a power of two >= 16, got {part_size}")
    if part_size < block_size:
        raise ValueError(f"part_size {part_size} is smaller than block_size {block_size}")
    need = smem_bytes(part_size, block_size, gqa, head_dim)
    if need > SMEM_LIMIT:
        raise ValueError(f"part_size {part_size} needs {need} bytes of shared memory, more "
                         f"than {SMEM_LIMIT}")
    return part_size


def choose_part_size(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_size: int,
                     gqa: int, head_dim: int, num_sms: int) -> int:
    """The largest partition (512 down to 64 tokens, never below block_size) that still gives
    the grid at least 2 CTAs per SM: the flash-decoding split."""
    cands = [p for p in (512, 256, 128, 64) if p >= block_size
             and smem_bytes(p, block_size, gqa, head_dim) <= SMEM_DEFAULT] or [block_size]
    for p in cands:
        if num_seqs * num_kv_heads * -(-max(max_seq_len, 1) // p) >= 2 * num_sms:
            return p
    return cands[-1]


def choose_part_size_mma(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_size: int,
                         num_sms: int) -> int:
    """For the tensor-core kernel (no per-token shared memory): the largest partition, 2048
    down to 64 tokens (never below block_size), that still gives the grid at least 2 CTAs per
    SM. Fewer, longer CTAs amortize each CTA's fixed start (block-table and query loads) and
    end (the merge of the warps and the scratch write)."""
    cands = [p for p in (2048, 1024, 512, 256, 128, 64) if p >= block_size] or [block_size]
    for p in cands:
        if num_seqs * num_kv_heads * -(-max(max_seq_len, 1) // p) >= 2 * num_sms:
            return p
    return cands[-1]


def choose_part_size_cp(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_size: int,
                        num_sms: int, ctas_per_sm: int = 3, longest: int = 8192) -> int:
    """For the pipelined tensor-core kernel (cp3): the power of two, max(32, block_size) up to
    ``longest`` (8192) tokens, that minimizes a cost model fitted to the H200 sweep of 2026-11-29
    (results/bench_run3_sweep.md; each of the 9 benchmark shapes gets its measured best or
    within 1.5% of it, confirmed in results/bench.md):

    - CTAs spread evenly over the SMs; the busiest SM runs m of them, ``ctas_per_sm`` at a
      time. A batch of b concurrent CTAs of w tokens takes max(b, 2) * w token-times: two CTAs
      already saturate an SM's share of the bandwidth, one alone runs at about half of it.
    - each batch costs 256 token-times more (the CTA's start: seq_len, block table, first K
      loads are dependent trips to memory; its end: the merge of the warps);
    - each partition of a sequence costs 32 (the reduce kernel reads it).
    Ties go to the longer partition.
    """
    lo = max(32, block_size)
    cands = [1 << k for k in range(5, 31) if lo <= 1 << k <= longest] or [lo]
    if max_seq_len <= 0:
        return cands[0]
    # no longer than needed for one partition per sequence
    cands = [p for i, p in enumerate(cands) if i == 0 or cands[i - 1] < max_seq_len]

    def cost(p: int) -> int:
        parts = -(-max_seq_len // p)
        ctas = num_seqs * num_kv_heads * parts
        m = -(-ctas // num_sms)
        full, rem = divmod(m, ctas_per_sm)
        w = min(p, max_seq_len)
        t = full * max(ctas_per_sm, 2) * w + (max(rem, 2) * w if rem else 0)
        return t + 256 * (full + (1 if rem else 0)) + 32 * parts

    return min(cands, key=lambda p: (cost(p), -p))


def check_max_seq_len(max_seq_len: Any, args: DecodeArgs) -> int:
    if not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool):
        raise TypeError(f"max_seq_len must be an int, got {type(max_seq_len).__name__}")
    cap = args.max_blocks * args.block_size
    if max_seq_len < 0 or max_seq_len > cap:
        raise ValueError(f"max_seq_len {max_seq_len} is outside [0, max_blocks * block_size = "
                         f"{cap}]")
    return max_seq_len
