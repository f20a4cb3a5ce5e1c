"""FA2's split-KV paged decode over an fp8 KV cache (fa2/fp8-kv.diff), on a real GPU.

Each case checks the fp8 library against a float64 reference of the dequantized cache
(fp8 value x descale), and the stock library (the unpatched tree's bf16 path) against a
float64 reference of its bf16 cache: GQA 32/8, paged with a shuffled block table, sequence
lengths that are not multiples of the block size, batch x context from 1 x 1k to 64 x 32k,
head dims 64/128/256, bf16 and fp16 queries, per-tensor, per-KV-head and per-(sequence,
KV-head) descales, forced split counts. The output is poisoned with NaN first, so an
unwritten element fails.

Tolerances (relative to the reference): L2 error below 1e-3 + r and worst element below
4 r + 2e-3 (times the reference's largest magnitude), r the rounding of one output element
(2^-8 bf16, 2^-11 fp16). FA2 rounds the softmax weights to the query dtype before P V, which
is the 1e-3 term; K and V convert to it exactly, since every e4m3 value is a bf16 and fp16 one.

Libraries: $FA2FP8_LIB_DIR (libfa2fp8_smXY.so, libfa2stock_smXY.so from fa2/build.py; `nox -s
gpu_tests` builds the recipe's fa2 for the GPU present and hands in its libraries). Skipped
without CUDA or without the fp8 library (failed under QWEN38_GPU_REQUIRED=1); the stock
library's checks are skipped without it (the benchmark's baseline, not a recipe output).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.vllm_tree import record, require_cuda

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "fa2" / "python"))

import fa2fp8  # noqa: E402

torch = require_cuda()
REQUIRED = os.environ.get("QWEN38_GPU_REQUIRED") == "1"

DEV = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ROUND = {"bf16": 2.0**-8, "fp16": 2.0**-11}
HEADS, KV_HEADS = 32, 8
RESULTS: list[str] = []


def _libs_or_skip() -> None:
    major, minor = torch.cuda.get_device_capability()
    try:
        fa2fp8.find_library("fp8", major, minor)
    except FileNotFoundError as e:
        if REQUIRED:
            pytest.fail(str(e), pytrace=False)
        pytest.skip(str(e), allow_module_level=True)


def _stock_or_skip() -> None:
    """The stock (unpatched) library is the benchmark's baseline, which bench/fa2_gpu.sh
    builds beside the fp8 one; the recipe's fa2 output (what `nox -s gpu_tests` tests) does
    not hold it, so its checks are skipped there, never failed."""
    try:
        fa2fp8.find_library("stock", *torch.cuda.get_device_capability())
    except FileNotFoundError as e:
        pytest.skip(f"no stock library (bench/fa2_gpu.sh builds it): {e}")


_libs_or_skip()


@pytest.fixture(scope="module", autouse=True)
def _write_results() -> Any:
    yield
    if RESULTS:
        record("fa2_fp8_gpu", ["| case | splits | L2 rel err | worst / max ref | bound |",
                               "|---|---|---|---|---|", *RESULTS])


class Case:
    """A paged cache of fp8 codes over shuffled blocks, its descales and the queries."""

    def __init__(self, lens: list[int], d: int, name: str, scales: str, seed: int,
                 block_size: int = 16) -> None:
        gen = torch.Generator(device=DEV).manual_seed(seed)
        self.lens, self.d, self.name, self.bs = lens, d, name, block_size
        b = len(lens)
        nblk = [math.ceil(n / block_size) for n in lens]
        total = sum(nblk) + 7  # spare blocks nobody owns
        perm = torch.randperm(total, generator=gen, device=DEV).to(torch.int32)
        self.block_table = torch.zeros((b, max(nblk)), dtype=torch.int32, device=DEV)
        at = 0
        for i, n in enumerate(nblk):
            self.block_table[i, :n] = perm[at:at + n]
            at += n
        # Unused table entries point far past the cache: a read of one would fault.
        for i, n in enumerate(nblk):
            self.block_table[i, n:] = 2**30
        shape = (total, block_size, KV_HEADS, d)
        self.k8 = self._codes(shape, gen)
        self.v8 = self._codes(shape, gen)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
        self.q = torch.randn((b, HEADS, d), generator=gen, device=DEV).to(DTYPES[name])
        # Descales: each KV head (and sequence) its own magnitude, so a mixed-up index fails.
        hk = torch.arange(KV_HEADS, device=DEV, dtype=torch.float32)
        kh = (2.0 ** ((hk % 4) - 1.5)) / 40.0
        vh = (2.0 ** (1.0 - (hk % 3))) / 40.0
        if scales == "tensor":
            self.ks, self.vs = torch.tensor([0.7 / 40], device=DEV), torch.tensor([1.3 / 40], device=DEV)
        elif scales == "head":
            self.ks, self.vs = kh.contiguous(), vh.contiguous()
        elif scales == "batch_head":
            bb = 1.0 + torch.arange(b, device=DEV, dtype=torch.float32)[:, None] % 3
            self.ks, self.vs = (bb * kh).contiguous(), (vh / bb).contiguous()
        else:
            raise ValueError(scales)
        self.scales = scales

    @staticmethod
    def _codes(shape: tuple[int, ...], gen: Any) -> Any:
        out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=DEV)
        flat = out.view(shape[0], -1)
        step = max(1, (1 << 26) // flat.shape[1])
        for s in range(0, shape[0], step):
            x = torch.randn(flat[s:s + step].shape, generator=gen, device=DEV) * 40.0
            flat[s:s + step] = x.clamp(-448, 448).to(torch.float8_e4m3fn)
        return out

    def _per_seq(self, t: Any, i: int) -> Any:
        """Descale of sequence i as [KV_HEADS] float64."""
        t = t.double()
        if t.numel() == 1:
            return t.reshape(1).expand(KV_HEADS)
        return t if t.dim() == 1 else t[i]

    def _rows(self, cache: Any, i: int) -> Any:
        n = self.lens[i]
        blocks = self.block_table[i, :math.ceil(n / self.bs)].long()
        return cache[blocks].reshape(-1, KV_HEADS, self.d)[:n]

    def reference(self, k_cache: Any, v_cache: Any, descaled: bool) -> Any:
        """float64 attention of every sequence over its (dequantized) rows: [b, HEADS, d]."""
        g = HEADS // KV_HEADS
        out = torch.empty((len(self.lens), HEADS, self.d), dtype=torch.float64, device=DEV)
        for i in range(len(self.lens)):
            k = self._rows(k_cache, i).double()
            v = self._rows(v_cache, i).double()
            if descaled:
                k = k * self._per_seq(self.ks, i)[None, :, None]
                v = v * self._per_seq(self.vs, i)[None, :, None]
            q = self.q[i].double().view(KV_HEADS, g, self.d)
            s = torch.einsum("kgd,nkd->kgn", q, k) / math.sqrt(self.d)
            p = torch.softmax(s, dim=-1)
            out[i] = torch.einsum("kgn,nkd->kgd", p, v).reshape(HEADS, self.d)
        return out

    def stock_cache(self) -> tuple[Any, Any]:
        """The same values as a q-dtype cache (per-tensor descale folded in), for the stock path."""
        assert self.scales == "tensor"
        dt = self.q.dtype
        return ((self.k8.float() * float(self.ks)).to(dt), (self.v8.float() * float(self.vs)).to(dt))


def _check(label: str, got: Any, want: Any, name: str, splits: int) -> None:
    assert not bool(got.isnan().any()), f"{label}: unwritten (NaN) output elements"
    err = got.double() - want
    rel = float(err.norm() / want.norm())
    worst = float(err.abs().max() / want.abs().max())
    b_rel, b_worst = 1e-3 + ROUND[name], 4 * ROUND[name] + 2e-3
    RESULTS.append(f"| {label} | {splits} | {rel:.2e} | {worst:.2e} | {b_rel:.1e} / {b_worst:.1e} |")
    assert rel < b_rel, f"{label}: L2 relative error {rel:.2e} >= {b_rel:.1e}"
    assert worst < b_worst, f"{label}: worst element {worst:.2e} >= {b_worst:.1e}"


def _lens(batch: int, ctx: int, bs: int, seed: int) -> list[int]:
    """batch lengths in (ctx/2, ctx], none a multiple of the block size, the first ctx - 3."""
    gen = torch.Generator().manual_seed(seed)
    lens = [ctx - 3] + [int(x) for x in torch.randint(ctx // 2 + 1, ctx, (batch - 1,), generator=gen)]
    return [n - 1 if n % bs == 0 else n for n in lens]


def _run_fp8(c: Case, label: str, num_splits: int = 0) -> None:
    out = torch.full_like(c.q, float("nan"))
    fa2fp8.paged_decode(c.q, c.k8, c.v8, c.block_table, c.seq_lens, k_descale=c.ks,
                        v_descale=c.vs, num_splits=num_splits, out=out)
    torch.cuda.synchronize()
    splits = num_splits or _auto_splits(c)
    _check(label, out, c.reference(c.k8, c.v8, descaled=True), c.name, splits)


def _auto_splits(c: Case) -> int:
    major, minor = torch.cuda.get_device_capability()
    lib = fa2fp8.load("fp8", major, minor)
    return int(lib.num_splits(len(c.lens), HEADS, KV_HEADS, c.d, max(c.lens)))


GRID = [(1, 1024), (4, 4096), (8, 8192), (64, 8192), (64, 32768)]


@pytest.mark.parametrize("batch,ctx", GRID)
def test_fp8_batch_context_grid(batch: int, ctx: int) -> None:
    c = Case(_lens(batch, ctx, 16, batch + ctx), 128, "bf16", "head", seed=batch * 7 + ctx)
    _run_fp8(c, f"fp8 bf16 d128 {batch}x{ctx} per-head")


@pytest.mark.parametrize("scales", ["tensor", "head", "batch_head"])
@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_head_dims_dtypes_descales(d: int, name: str, scales: str) -> None:
    c = Case(_lens(8, 3000, 16, d), d, name, scales, seed=d + len(scales) + len(name))
    _run_fp8(c, f"fp8 {name} d{d} 8x3000 {scales}")


@pytest.mark.parametrize("num_splits", [1, 2, 5, 33])
def test_fp8_forced_splits(num_splits: int) -> None:
    # 1: the non-split kernel writing O directly; others: partials merged by the last split.
    c = Case(_lens(3, 5000, 16, 5), 128, "bf16", "head", seed=50 + num_splits)
    _run_fp8(c, f"fp8 bf16 d128 3x5000 splits={num_splits}", num_splits)


@pytest.mark.parametrize("num_splits", [2, 5, 33])
def test_fp8_merge_in_kernel(num_splits: int) -> None:
    """With split counters the decode kernel's last split merges the splits; without, FA2's
    combine kernel does. Both within the bound; the two merges within one output rounding of
    each other; the counters zero again after; and the same bits run to run, whichever split
    finishes last (the merge sums in split order)."""
    c = Case(_lens(3, 5000, 16, 6), 128, "bf16", "head", seed=60 + num_splits)
    counters = torch.zeros(3 * KV_HEADS, dtype=torch.int32, device=DEV)
    outs = []
    for combine_kernel in (False, False, True):
        out = torch.full_like(c.q, float("nan"))
        fa2fp8.paged_decode(c.q, c.k8, c.v8, c.block_table, c.seq_lens, k_descale=c.ks,
                            v_descale=c.vs, num_splits=num_splits, out=out,
                            split_counters=counters, combine_kernel=combine_kernel)
        torch.cuda.synchronize()
        outs.append(out)
    assert int(counters.abs().sum()) == 0, "the kernel left a split counter non-zero"
    assert torch.equal(outs[0], outs[1]), "the in-kernel merge differs from one run to the next"
    want = c.reference(c.k8, c.v8, descaled=True)
    _check(f"fp8 bf16 d128 3x5000 splits={num_splits} merged in kernel", outs[0], want, "bf16", num_splits)
    _check(f"fp8 bf16 d128 3x5000 splits={num_splits} combine kernel", outs[2], want, "bf16", num_splits)
    gap = float((outs[0].float() - outs[2].float()).abs().max() / outs[2].float().abs().max())
    assert gap <= 2 * ROUND["bf16"], f"the two merges differ by {gap:.2e} of the largest output"


def test_fp8_merge_in_kernel_graph_replay() -> None:
    """Captured in a CUDA graph with the module's own counters, replays give the eager bits."""
    c = Case(_lens(2, 3000, 16, 8), 128, "bf16", "head", seed=71)
    args = (c.q, c.k8, c.v8, c.block_table, c.seq_lens)
    kw = {"k_descale": c.ks, "v_descale": c.vs, "num_splits": 8, "max_seq_len": max(c.lens)}
    eager = fa2fp8.paged_decode(*args, **kw).clone()
    out = torch.empty_like(c.q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fa2fp8.paged_decode(*args, out=out, **kw)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fa2fp8.paged_decode(*args, out=out, **kw)
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), "a graph replay differs from the eager call"


def test_fp8_merge_in_kernel_on_two_streams_at_once() -> None:
    """Two streams decoding at once get their own counters (the module keeps one buffer per
    stream): each stream's outputs are the eager call's bits, launch after launch."""
    cases = [Case(_lens(4, 4000, 16, 10 + i), 128, "bf16", "head", seed=80 + i) for i in range(2)]
    want = [fa2fp8.paged_decode(c.q, c.k8, c.v8, c.block_table, c.seq_lens, k_descale=c.ks,
                                v_descale=c.vs, num_splits=8).clone() for c in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    outs = [torch.full_like(c.q, float("nan")) for c in cases]
    torch.cuda.synchronize()
    for _ in range(20):
        for c, st, out in zip(cases, streams, outs, strict=True):
            with torch.cuda.stream(st):
                fa2fp8.paged_decode(c.q, c.k8, c.v8, c.block_table, c.seq_lens, k_descale=c.ks,
                                    v_descale=c.vs, out=out, max_seq_len=max(c.lens), num_splits=8)
    torch.cuda.synchronize()
    for got, w in zip(outs, want, strict=True):
        assert torch.equal(got, w), "a stream's output differs from the eager call's"


def test_fp8_max_seq_len_below_a_length() -> None:
    """Splits are cut from max_seq_len; a sequence longer than it (a caller's mistake) is cut
    from its own length instead, not truncated."""
    c = Case([3001, 700], 128, "bf16", "head", seed=72)
    out = torch.full_like(c.q, float("nan"))
    fa2fp8.paged_decode(c.q, c.k8, c.v8, c.block_table, c.seq_lens, k_descale=c.ks,
                        v_descale=c.vs, num_splits=4, max_seq_len=1000, out=out)
    torch.cuda.synchronize()
    _check("fp8 bf16 d128 [3001, 700], max_seq_len 1000", out,
           c.reference(c.k8, c.v8, descaled=True), "bf16", 4)


@pytest.mark.parametrize("block_size", [32, 64])
def test_fp8_block_sizes(block_size: int) -> None:
    for d in (64, 256):
        c = Case(_lens(5, 2500, block_size, block_size), d, "fp16", "head", seed=block_size + d,
                 block_size=block_size)
        _run_fp8(c, f"fp8 fp16 d{d} 5x2500 block {block_size}")


def test_fp8_short_sequences() -> None:
    # Shorter than one tile, one row, one block: the masked first (and only) tile.
    c = Case([1, 2, 15, 17, 255, 257], 128, "bf16", "batch_head", seed=3)
    _run_fp8(c, "fp8 bf16 d128 lens 1..257")


@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_conversion_is_exact(d: int, name: str) -> None:
    # One key per sequence: P = 1, so the output is that key's V row, which every e4m3 value
    # (subnormals, zeros and the largest included) must reach unrounded in bf16 and fp16.
    c = Case([1, 1], d, name, "tensor", seed=d)
    codes = torch.tensor([x for x in range(256) if x & 0x7F != 0x7F], dtype=torch.uint8, device=DEV)
    row = codes.repeat(math.ceil(KV_HEADS * d / len(codes)))[: KV_HEADS * d]
    v8 = c.v8.view(torch.uint8)
    for i in range(2):
        v8[int(c.block_table[i, 0]), 0] = row.roll(i * 7).view(KV_HEADS, d)
    out = torch.full_like(c.q, float("nan"))
    fa2fp8.paged_decode(c.q, c.k8, c.v8, c.block_table, c.seq_lens, k_descale=c.ks, out=out)
    torch.cuda.synchronize()
    g = HEADS // KV_HEADS
    for i in range(2):
        want = c.v8[int(c.block_table[i, 0]), 0].float().repeat_interleave(g, dim=0)
        assert torch.equal(out[i].float(), want), f"{name} d{d}: a converted V value differs"
    RESULTS.append(f"| fp8 {name} d{d}: all 254 e4m3 values through V, exact | - | 0 | 0 | exact |")


@pytest.mark.parametrize("batch,ctx,d", [(1, 1024, 128), (8, 3000, 64), (8, 3000, 256), (64, 32768, 128)])
def test_stock_bf16(batch: int, ctx: int, d: int) -> None:
    _stock_or_skip()
    c = Case(_lens(batch, ctx, 16, d), d, "bf16", "tensor", seed=batch + ctx + d)
    k, v = c.stock_cache()
    del c.k8, c.v8
    for splits in (0, 1):
        out = torch.full_like(c.q, float("nan"))
        fa2fp8.paged_decode(c.q, k, v, c.block_table, c.seq_lens, num_splits=splits, out=out)
        torch.cuda.synchronize()
        _check(f"stock bf16 d{d} {batch}x{ctx}", out, c.reference(k, v, descaled=False), "bf16",
               splits or _auto_splits(c))


def test_fp8_rejects_what_it_cannot_run() -> None:
    c = Case([100, 40], 128, "bf16", "head", seed=9)
    with pytest.raises(ValueError, match="descale of shape"):
        fa2fp8.paged_decode(c.q, c.k8, c.v8, c.block_table, c.seq_lens,
                            k_descale=torch.ones(3, device=DEV))
    with pytest.raises(ValueError, match="split_counters"):
        fa2fp8.paged_decode(c.q, c.k8, c.v8, c.block_table, c.seq_lens, num_splits=2,
                            split_counters=torch.zeros(2 * KV_HEADS - 1, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="head_dim"):
        fa2fp8.paged_decode(c.q[..., :96].contiguous(), c.k8[..., :96].contiguous(),
                            c.v8[..., :96].contiguous(), c.block_table, c.seq_lens)


def test_stock_refuses_fp16() -> None:
    """The stock library holds no fp16; the C entry says so rather than running anything."""
    _stock_or_skip()
    t = Case([100, 40], 128, "bf16", "tensor", seed=9)
    k, v = t.stock_cache()
    with pytest.raises(RuntimeError, match="not built"):
        fa2fp8.paged_decode(t.q.half(), k.half(), v.half(), t.block_table, t.seq_lens)
