"""pthfa's argument checks, on stand-in tensors: no torch, CuPy or GPU needed."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pthfa" / "python"))

from pthfa import _validate as V
from pthfa import find_cubin


@dataclass(frozen=True)
class Dev:
    type: str = "cuda"
    index: int | None = 0


@dataclass
class T:
    shape: tuple[int, ...]
    dtype: str = "torch.bfloat16"
    device: Dev = field(default_factory=Dev)
    contiguous: bool = True
    strides: tuple[int, ...] | None = None

    def stride(self) -> tuple[int, ...]:
        if self.strides is not None:
            return self.strides
        out, acc = [], 1
        for s in reversed(self.shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    def is_contiguous(self) -> bool:
        return self.contiguous

    def get_device(self) -> int:
        return -1 if self.device.index is None else self.device.index


NB, BS, KVH, D, S, H = 10, 16, 2, 128, 3, 8


def cache() -> dict[str, T]:
    return {"k_cache": T((NB, BS, KVH, D), "torch.int8"), "v_cache": T((NB, BS, KVH, D), "torch.int8"),
            "k_scale": T((NB, BS, KVH), "torch.float32"), "v_scale": T((NB, BS, KVH), "torch.float32")}


def dec(**over: object) -> dict[str, object]:
    args: dict[str, object] = {"query": T((S, H, D)), **cache(),
                               "block_tables": T((S, 5), "torch.int32"),
                               "seq_lens": T((S,), "torch.int32")}
    args.update(over)
    return args


def quant(**over: object) -> dict[str, object]:
    args: dict[str, object] = {"key": T((7, KVH, D)), "value": T((7, KVH, D)), **cache(),
                               "slot_mapping": T((7,), "torch.int64")}
    args.update(over)
    return args


def test_decode_ok() -> None:
    a = V.check_decode(**dec())
    assert (a.dtype, a.gqa, a.block_size, a.bt_stride, a.head_dim) == ("bf16", 4, 16, 5, 128)


def test_quantize_ok_strided_view() -> None:
    key = T((7, KVH, D), contiguous=False, strides=(6 * KVH * D, D, 1))
    a = V.check_quantize(**quant(key=key))
    assert a.key_strides == (6 * KVH * D, D) and a.value_strides == (KVH * D, D)


@pytest.mark.parametrize("over,exc,msg", [
    ({"query": 3}, TypeError, "query must be a torch.Tensor, got int"),
    ({"query": T((S, H, D), "torch.float32")}, ValueError, "query must have dtype"),
    ({"query": T((S, H))}, ValueError, "query must be 3-D"),
    ({"query": T((S, H, 64))}, ValueError, "head_dim 64 does not match"),
    ({"query": T((S, 7, D))}, ValueError, "not a multiple of num_kv_heads"),
    ({"query": T((S, 32, D))}, ValueError, "GQA ratios"),
    ({"query": T((S, H, D), contiguous=False)}, ValueError, "query must be contiguous"),
    ({"query": T((S, H, D), device=Dev("cpu", None))}, ValueError, "must be on a CUDA device"),
    ({"seq_lens": T((S,), device=Dev("cuda", 1), dtype="torch.int32")}, ValueError,
     "seq_lens is on cuda:1 but query is on cuda:0"),
    ({"seq_lens": T((S,), "torch.int64")}, ValueError, "seq_lens must have dtype torch.int32"),
    ({"seq_lens": T((S + 1,), "torch.int32")}, ValueError, "seq_lens has 4 entries for 3"),
    ({"block_tables": T((S, 5), "torch.int64")}, ValueError, "block_tables must have dtype"),
    ({"block_tables": T((S + 1, 5), "torch.int32")}, ValueError, "block_tables has 4 rows"),
    ({"block_tables": T((S, 5), "torch.int32", strides=(1, S))}, ValueError,
     "block_tables' last dimension must be contiguous"),
    ({"k_cache": T((NB, BS, KVH, D), "torch.uint8")}, ValueError, "k_cache must have dtype"),
    ({"v_cache": T((NB, BS, KVH, 64), "torch.int8")}, ValueError, "they must match"),
    ({"k_scale": T((NB, BS), "torch.float32")}, ValueError, "k_scale must have shape"),
    ({"v_scale": T((NB, BS, KVH), "torch.float16")}, ValueError, "v_scale must have dtype"),
    ({"k_cache": T((NB, BS, KVH, D), "torch.int8", contiguous=False,
                   strides=(BS * KVH * D, D, BS * D, 1))}, ValueError,
     "k_cache must be contiguous inside each block"),
    ({"k_cache": T((NB, BS, KVH, D), "torch.int8", contiguous=False,
                   strides=(BS * KVH * D + 8, KVH * D, D, 1))}, ValueError,
     "k_cache's block stride"),
    ({"out": T((S, H, D), "torch.float16")}, ValueError, "out has dtype torch.float16"),
    ({"out": T((S, H, D + 1))}, ValueError, "out must have shape"),
])
def test_decode_rejects(over: dict[str, object], exc: type[Exception], msg: str) -> None:
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace("[", r"\[")):
        V.check_decode(**dec(**over))


def test_block_size_and_head_dim() -> None:
    c = {"k_cache": T((NB, 24, KVH, D), "torch.int8"), "v_cache": T((NB, 24, KVH, D), "torch.int8"),
         "k_scale": T((NB, 24, KVH), "torch.float32"), "v_scale": T((NB, 24, KVH), "torch.float32")}
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        V.check_decode(**dec(**c))
    c = {"k_cache": T((NB, BS, KVH, 96), "torch.int8"), "v_cache": T((NB, BS, KVH, 96), "torch.int8"),
         "k_scale": T((NB, BS, KVH), "torch.float32"), "v_scale": T((NB, BS, KVH), "torch.float32")}
    with pytest.raises(ValueError, match="head_dim must be one of"):
        V.check_decode(**dec(query=T((S, H, 96)), **c))


@pytest.mark.parametrize("over,exc,msg", [
    ({"key": None}, TypeError, "key must be a torch.Tensor, got NoneType"),
    ({"value": T((7, KVH, D), "torch.float16")}, ValueError, "value has dtype torch.float16"),
    ({"key": T((7, KVH, D), "torch.float32"), "value": T((7, KVH, D), "torch.float32")},
     ValueError, "key must have dtype"),
    ({"key": T((7, KVH, D), strides=(KVH * D, 1, KVH))}, ValueError,
     "key's last dimension must be contiguous"),
    ({"key": T((7, 4, D)), "value": T((7, 4, D))}, ValueError, "does not match the cache"),
    ({"slot_mapping": T((7,), "torch.int32")}, ValueError, "slot_mapping must have dtype"),
    ({"slot_mapping": T((6,), "torch.int64")}, ValueError, "slot_mapping has 6 entries"),
])
def test_quantize_rejects(over: dict[str, object], exc: type[Exception], msg: str) -> None:
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace("[", r"\[")):
        V.check_quantize(**quant(**over))


def test_part_size() -> None:
    assert V.choose_part_size(64, 8, 8192, 16, 4, 128, 132) == 512
    assert V.choose_part_size(1, 8, 8192, 16, 4, 128, 132) == 128
    assert V.choose_part_size(1, 1, 10, 16, 4, 128, 132) == 64
    with pytest.raises(ValueError, match="power of two"):
        V.check_part_size(100, 16, 4, 128)
    with pytest.raises(ValueError, match="smaller than block_size"):
        V.check_part_size(16, 32, 4, 128)
    with pytest.raises(TypeError):
        V.check_part_size(64.0, 16, 4, 128)


def test_find_cubin(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no pthfa cubin for compute capability 9\.0"):
        find_cubin(9, 0, tmp_path)
    (tmp_path / "compute_80.ptx").write_text("ptx")
    assert find_cubin(9, 0, tmp_path).name == "compute_80.ptx"
    (tmp_path / "sm_80.cubin").write_bytes(b"x")
    assert find_cubin(8, 6, tmp_path).name == "sm_80.cubin"
    (tmp_path / "sm_90.cubin").write_bytes(b"x")
    assert find_cubin(9, 0, tmp_path).name == "sm_90.cubin"


def test_full_validation_runs_once_per_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached fast path: a repeat call skips the full check; a changed shape, dtype,
    stride or device runs it again (and a bad one still raises)."""
    from pthfa import _ops, _signature

    monkeypatch.delenv("PTHFA_VALIDATE", raising=False)
    _ops.reload_env()
    calls: list[int] = []

    def counting(*tensors: object) -> object:
        calls.append(1)
        return V.check_decode(*tensors)

    seen: dict[tuple[object, ...], Any] = {}
    args = dec()
    order = ["query", "k_cache", "v_cache", "k_scale", "v_scale", "block_tables", "seq_lens"]

    def run(**over: object) -> object:
        a = {**args, **over}
        return _signature._checked(seen, counting, _signature._decode_key,
                                   *(a[k] for k in order), None)

    first = run()
    assert run() == first and len(calls) == 1  # the same signature: no second full check
    run(query=T((S + 1, H, D)), block_tables=T((S + 1, 5), "torch.int32"),
        seq_lens=T((S + 1,), "torch.int32"))
    assert len(calls) == 2  # a new shape
    with pytest.raises(ValueError, match="dtype"):
        run(query=T((S, H, D), "torch.float32"))  # a new dtype: checked, and refused
    with pytest.raises(ValueError, match="contiguous"):
        run(block_tables=T((S, 5), "torch.int32", strides=(1, S)))  # new strides
    run(**{k: T(v.shape, v.dtype, Dev(index=1)) for k, v in args.items()
           if isinstance(v, T)})
    assert len(calls) == 5  # another device: its own entry
    monkeypatch.setenv("PTHFA_VALIDATE", "always")
    run()
    assert len(calls) == 5  # the knobs are read once: a change needs reload_env()
    _ops.reload_env()
    run()
    run()
    assert len(calls) == 7  # the debug switch checks every call
    monkeypatch.delenv("PTHFA_VALIDATE")
    _ops.reload_env()


def test_non_tensors_always_get_the_full_check() -> None:
    from pthfa import _signature

    with pytest.raises(TypeError):
        _signature._checked({}, V.check_decode, _signature._decode_key, *([object()] * 7), None)


def test_the_driver_argument_block_holds_each_value_at_its_address() -> None:
    """What cuLaunchKernel reads: an array of addresses, each of a value of the kernel's type
    at its natural alignment; one pack_into refills the same block."""
    import ctypes

    from pthfa import _driver

    blk = _driver._ArgBlock("QifiqQ")
    blk.pack(2**40 + 7, -5, 1.5, 9, -(2**35), 2**64 - 1)
    slots = list((ctypes.c_uint64 * 6).from_address(blk.address))
    assert [a % b for a, b in zip(slots, (8, 4, 4, 4, 8, 8), strict=True)] == [0] * 6
    assert ctypes.c_uint64.from_address(slots[0]).value == 2**40 + 7
    assert ctypes.c_int32.from_address(slots[1]).value == -5
    assert ctypes.c_float.from_address(slots[2]).value == 1.5
    assert ctypes.c_int32.from_address(slots[3]).value == 9
    assert ctypes.c_int64.from_address(slots[4]).value == -(2**35)
    assert ctypes.c_uint64.from_address(slots[5]).value == 2**64 - 1
    blk.pack(1, 2, 0.25, 3, 4, 5)
    assert ctypes.c_int32.from_address(slots[1]).value == 2
    import struct

    with pytest.raises(struct.error):  # an int32 argument out of range never wraps
        blk.pack(1, 2**31, 0.25, 3, 4, 5)
    # a fixed tail written once; each call packs only the head, the tail stays
    fixed = _driver._ArgBlock("QQiqf", tail=(-7, 2**40, 0.5))
    fixed.pack_head(11, 12)
    fixed.pack_head(21, 22)
    at = list((ctypes.c_uint64 * 5).from_address(fixed.address))
    assert [ctypes.c_uint64.from_address(x).value for x in at[:2]] == [21, 22]
    assert ctypes.c_int32.from_address(at[2]).value == -7
    assert ctypes.c_int64.from_address(at[3]).value == 2**40
    assert ctypes.c_float.from_address(at[4]).value == 0.5


@pytest.mark.parametrize("fmt,kernel", [
    ("FMT_QUANTIZE", "quantize"), ("FMT_PART", "part"), ("FMT_MMA", "mma"),
    ("FMT_CP", "cp"), ("FMT_WB", "wb"), ("FMT_WB", "ws"), ("FMT_REDUCE", "reduce")])
def test_argument_formats_match_the_kernels(fmt: str, kernel: str) -> None:
    """Each launch format has one code per parameter of its kernel in decode.cu/quantize.cu,
    of the same type: the driver reads exactly these bytes."""
    from pthfa import _driver

    csrc = Path(__file__).resolve().parents[1] / "pthfa" / "csrc"
    src, name = {"quantize": ("quantize.cu", "pthfa_quantize_##TN##_d##D("),
                 "part": ("decode.cu", "pthfa_decode_part_##TN##_d##D##_g##G("),
                 "mma": ("decode.cu", "pthfa_decode_mma##NS##SUF##_##TN##_d##D("),
                 "cp": ("decode.cu", "pthfa_decode_cp##S##_##TN##_d##D("),
                 "wb": ("decode.cu", "pthfa_decode_wb##S##_##TN##_d##D##_h##NW("),
                 "ws": ("decode.cu", "pthfa_decode_##NAME##_##TN##_d128_h8("),
                 "reduce": ("decode.cu", "pthfa_decode_reduce_##TN##_d##D(")}[kernel]
    text = (csrc / src).read_text()
    at = text.index(name) + len(name)
    params = text[at:text.index(")", at)].replace("\\", " ").split(",")
    types = {"int": "i", "float": "f", "long": "q"}
    codes = "".join("Q" if "*" in p_ else types[p_.split()[-2]] for p_ in params)
    assert codes == getattr(_driver, fmt)


def test_block_strided_caches() -> None:
    """Caches that are views into vLLM's pages (each block contiguous inside, blocks a page
    apart) are taken, and their block strides reach the kernels' arguments; K and V (and
    their scales) must share their strides."""
    page = 2 * BS * KVH * D + 8 * BS * KVH  # bytes: K, V, then the two scales' floats
    kv = (page, KVH * D, D, 1)
    sc = (page // 4, KVH, 1)
    paged = {"k_cache": T((NB, BS, KVH, D), "torch.int8", contiguous=False, strides=kv),
             "v_cache": T((NB, BS, KVH, D), "torch.int8", contiguous=False, strides=kv),
             "k_scale": T((NB, BS, KVH), "torch.float32", contiguous=False, strides=sc),
             "v_scale": T((NB, BS, KVH), "torch.float32", contiguous=False, strides=sc)}
    a = V.check_decode(**dec(**paged))
    assert (a.kv_bstride, a.sc_bstride) == (page, page // 4)
    c = V.check_decode(**dec())
    assert (c.kv_bstride, c.sc_bstride) == (BS * KVH * D, BS * KVH)
    q = V.check_quantize(T((4, KVH, D)), T((4, KVH, D)), paged["k_cache"], paged["v_cache"],
                         paged["k_scale"], paged["v_scale"], T((4,), "torch.int64"))
    assert (q.block_shift, q.kv_bstride, q.sc_bstride) == (4, page, page // 4)
    with pytest.raises(ValueError, match="v_cache's strides"):
        V.check_decode(**dec(**{**paged, "v_cache": T((NB, BS, KVH, D), "torch.int8")}))
    with pytest.raises(ValueError, match="v_scale's strides"):
        V.check_decode(**dec(**{**paged, "v_scale": T((NB, BS, KVH), "torch.float32")}))


def test_whole_block_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """$PTHFA_IMPL=wb4: one CTA of 8 warps per (partition, sequence), partitions as short as
    one wave of CTAs allows, its shared memory; shapes it is not built for take cp3."""
    from pthfa import _driver, _ops, _plan

    monkeypatch.setattr(_plan, "_kernel", lambda dev, name, fmt, smem=0: (dev, name, fmt, smem))
    monkeypatch.setattr(_plan, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(_plan, "_capability", lambda dev: 9)
    monkeypatch.setenv("PTHFA_IMPL", "wb4")
    _ops.reload_env()
    try:
        assert V.choose_part_size_wb(64, 8192, 16, 132) == 4096
        assert V.choose_part_size_wb(8, 8192, 16, 132) == 512
        assert V.choose_part_size_wb(1, 1024, 16, 132) == 16
        kvh8 = {"query": T((S, 32, D)), "k_cache": T((NB, BS, 8, D), "torch.int8"),
                "v_cache": T((NB, BS, 8, D), "torch.int8"),
                "k_scale": T((NB, BS, 8), "torch.float32"),
                "v_scale": T((NB, BS, 8), "torch.float32"),
                "block_tables": T((S, 5), "torch.int32"), "seq_lens": T((S,), "torch.int32")}
        a = V.check_decode(**kvh8)
        p = _plan._DecodePlan(a, 70, None, None)
        assert p.grid == (5, 1, S) and p.threads == 256 and p.fmt == _driver.FMT_WB
        part: object = p.part
        assert part == (0, "pthfa_decode_wb4_bf16_d128_h8", _driver.FMT_WB,
                        V.smem_bytes_wb(16, BS, 8, D, 4))
        assert p.counters == 0
        q = _plan._DecodePlan(V.check_decode(**dec()), 70, None, None)  # 2 KV heads: cp3
        assert q.threads == V.THREADS and q.fmt == _driver.FMT_CP
    finally:
        monkeypatch.delenv("PTHFA_IMPL")
        _ops.reload_env()


def _kvh8(seqs: int, max_blocks: int = 5, bs: int = BS) -> dict[str, Any]:
    nb = seqs * max_blocks + 1
    return {"query": T((seqs, 32, D)), "k_cache": T((nb, bs, 8, D), "torch.int8"),
            "v_cache": T((nb, bs, 8, D), "torch.int8"),
            "k_scale": T((nb, bs, 8), "torch.float32"),
            "v_scale": T((nb, bs, 8), "torch.float32"),
            "block_tables": T((seqs, max_blocks), "torch.int32"),
            "seq_lens": T((seqs,), "torch.int32")}


def test_split_whole_block_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """On sm_90, 8 KV heads of 128 dims, blocks of 16 tokens or more, from 8 sequences of
    2**17 tokens together (or 64 of any length): the split whole-block kernel wt6 (one CTA
    of 8 compute warps and a producer warp per partition and sequence, partitions by cp3's
    cost model at one CTA per SM), with its shared memory and the reduce kernel. Smaller
    batches, other shapes and older GPUs keep cp3; $PTHFA_IMPL still forces; a forced wt6
    runs as ws6 before sm_90."""
    from pthfa import _driver, _ops, _plan

    monkeypatch.setattr(_plan, "_kernel", lambda dev, name, fmt, smem=0: (dev, name, fmt, smem))
    monkeypatch.setattr(_plan, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(_plan, "_capability", lambda dev: 9)
    _ops.reload_env()
    assert _plan.plan(64, 8, 8192, 16, 4, 128, 132) == ("wt6", 4096)
    assert _plan.plan(64, 8, 32768, 16, 4, 128, 132) == ("wt6", 16384)
    assert _plan.plan(64, 8, 1024, 16, 4, 128, 132)[0] == "wt6"
    assert _plan.plan(8, 8, 32768, 16, 4, 128, 132)[0] == "wt6"
    assert _plan.plan(16, 8, 8192, 16, 4, 128, 132)[0] == "wt6"
    for b, ctx in ((1, 1 << 20), (8, 8192), (16, 1024), (32, 1024), (63, 2048)):
        assert _plan.plan(b, 8, ctx, 16, 4, 128, 132)[0] == "cp3", (b, ctx)
    assert _plan.plan(64, 8, 8192, 16, 4, 128, 132, sm_major=8)[0] == "cp3"
    assert _plan.plan(64, 4, 8192, 16, 8, 128, 132)[0] == "cp3"  # 4 KV heads
    assert _plan.plan(64, 8, 8192, 16, 4, 64, 132)[0] == "cp3"  # head_dim 64
    assert _plan.plan(64, 8, 8192, 8, 4, 128, 132)[0] == "cp3"  # a step spans blocks
    # one wave of 128 CTAs at 64 x 8k; never a longer partition than the block-table slice
    # leaves room for
    assert V.choose_part_size_ws(64, 8192, 16, 132, 1) == 4096
    assert V.choose_part_size_ws(64, 8192, 16, 132, 2) == 2048
    assert V.choose_part_size_ws(1, 1 << 20, 16, 132, 1) <= V.WS_MAX_PART
    assert V.smem_bytes_ws(4096, 16, 6) == 128 + 6 * 33792 + 4 * 256
    assert V.smem_bytes_ws(V.WS_MAX_PART, 16, 3) * 2 + 2048 <= 228 << 10  # 2 CTAs per SM
    assert V.smem_bytes_ws(V.WS_MAX_PART, 16, 6) <= V.SMEM_LIMIT
    a = V.check_decode(**_kvh8(64))
    p = _plan._DecodePlan(a, 70, None, None)
    ps = V.choose_part_size_ws(64, 70, BS, 132, 1)
    assert p.grid == (-(-70 // ps), 1, 64) and p.threads == 288 and p.fmt == _driver.FMT_WB
    part: object = p.part
    assert part == (0, "pthfa_decode_wt6_bf16_d128_h8", _driver.FMT_WB,
                    V.smem_bytes_ws(ps, BS, 6))
    assert p.part_ints[:4] == (4, 4, ps, -(-70 // ps))  # gqa, block_shift, part, parts
    p32 = _plan._DecodePlan(a, 70, 32, None)  # an explicit partition size: the same kernel
    assert p32.grid == (3, 1, 64) and p32.part_ints[:4] == (4, 4, 32, 3)
    assert p.counters == 0  # the reduce kernel merges the partitions, eager too
    small = _plan._DecodePlan(V.check_decode(**_kvh8(8)), 70, None, None)
    assert small.fmt == _driver.FMT_CP and small.threads == V.THREADS
    monkeypatch.setattr(_plan, "_capability", lambda dev: 8)
    _ops.reload_env()
    old = _plan._DecodePlan(V.check_decode(**_kvh8(64)), 70, None, None)
    assert old.fmt == _driver.FMT_CP  # before sm_90: cp3
    monkeypatch.setenv("PTHFA_IMPL", "wt6")
    _ops.reload_env()
    try:
        w8 = _plan._DecodePlan(V.check_decode(**_kvh8(2)), 70, None, None)
        assert w8.threads == 256  # no bulk copy engine before sm_90: ws6
        assert w8.part[1] == "pthfa_decode_ws6_bf16_d128_h8"  # type: ignore[index]
        monkeypatch.setattr(_plan, "_capability", lambda dev: 9)
        w = _plan._DecodePlan(V.check_decode(**_kvh8(2)), 70, None, None)
        assert w.threads == 288 and w.grid == (3, 1, 2)  # a ninth warp: the producer
        monkeypatch.setenv("PTHFA_IMPL", "cp3")
        _ops.reload_env()
        assert _plan.plan(64, 8, 8192, 16, 4, 128, 132)[0] == "cp3"
    finally:
        monkeypatch.delenv("PTHFA_IMPL")
        _ops.reload_env()


def test_plan_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan is made per bucket of max_seq_len: never below it, at most 12.5% above, never
    above the block tables' capacity, and few buckets over a long generation. The plan's
    grid, scratch and kernels follow the bucket (kernel loading needs a GPU: recorded here)."""
    from pthfa import _driver, _plan

    monkeypatch.setattr(_plan, "_kernel", lambda dev, name, fmt, smem=0: (dev, name, fmt, smem))

    seen = set()
    for n in range(0, 40000):
        b = _plan._bucket(n, 40000)
        assert n <= b <= max(n, n + n // 8 + 1)
        seen.add(b)
    assert len(seen) < 160
    assert _plan._bucket(5000, 5003) == 5003 and _plan._bucket(5000, 8192) == 5120
    a = V.check_decode(**dec())
    p = _plan._DecodePlan(a, _plan._bucket(70, a.max_blocks * a.block_size), 32, None)
    assert p.grid == (3, KVH, S) and p.reduce_ints == (H, 32, 3)
    assert p.work_bytes == S * H * 3 * (D + 2) * 4 and p.acc_bytes == S * H * 3 * D * 4
    part: object = p.part
    reduce: object = p.reduce
    assert p.counters == S * KVH  # cp3 reduces in its last CTAs: a counter per (seq, head)
    assert part == (0, "pthfa_decode_cp3_bf16_d128", _driver.FMT_CP,
                      V.smem_bytes_cp(32, BS, H // KVH, D, 3))
    assert reduce == (0, "pthfa_decode_reduce_bf16_d128", _driver.FMT_REDUCE, 0)
