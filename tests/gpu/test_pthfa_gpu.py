"""pthfa kernels on a real GPU against float64 torch references (marker ``gpu``).

Skipped, with the reason, where torch, CuPy or a CUDA device is missing. Every case draws fresh
random data (never zeros) and poisons the outputs first, so an unwritten element fails.
Run: ``PYTHONPATH=pthfa/python python -m pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
# An installed pthfa (the wheel the recipe built, as `nox -s gpu_tests` installs it) is tested
# as installed; otherwise the source tree, with cubins from PTHFA_CUBIN_DIR or its cubins/.
_spec = importlib.util.find_spec("pthfa")
if _spec is None or _spec.origin is None:
    sys.path.insert(0, str(ROOT / "pthfa" / "python"))
# The GPU tests' skip rule (tests/gpu/vllm_tree.py): under `nox -s gpu_tests`
# (QWEN38_GPU_REQUIRED=1) a missing stack fails.
from tests.gpu.vllm_tree import missing as _missing  # noqa: E402

try:
    import torch
except ImportError:
    _missing("torch is not installed: no GPU tests")
if not torch.cuda.is_available():
    _missing("no CUDA GPU visible to torch")
try:
    import cupy  # noqa: F401
except ImportError:
    _missing("CuPy is not installed: the pthfa launcher needs it")

from pthfa.reference import attention_ref, gather_kv, quantize_ref  # noqa: E402

import pthfa  # noqa: E402

DEV = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# worst relative rounding of one output element (half an ulp at the bottom of a binade)
ROUND = {"bf16": 2.0**-8, "fp16": 2.0**-11}
RESULTS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _cubin_present() -> None:
    major, minor = torch.cuda.get_device_capability()
    # a missing cubin on a GPU machine is a failure, not a skip
    pthfa.find_cubin(major, minor)


def _rows(n: int, kvh: int, d: int, dtype: Any, gen: Any) -> Any:
    x = torch.randn((n, kvh, d), generator=gen, device=gen.device)
    mag = torch.exp(0.7 * torch.randn((n, kvh, 1), generator=gen, device=gen.device))
    return (x * mag).to(dtype)


def _rel(a: Any, b: Any) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def test_quantize_roundtrip() -> None:
    gen = torch.Generator(device=DEV).manual_seed(1)
    for name, dtype in DTYPES.items():
        for d in (64, 128, 256):
            for bs in (16, 32):
                kvh, nb, n = 4, 40, 300
                key = _rows(n, kvh, d, dtype, gen)
                value = _rows(n, kvh, d, dtype, gen)
                slots = torch.randperm(nb * bs, generator=gen, device=DEV)[:n].to(torch.int64)
                skip = torch.rand(n, generator=gen, device=DEV) < 0.1
                slots[skip] = -1
                k_cache = torch.full((nb, bs, kvh, d), -128, dtype=torch.int8, device=DEV)
                v_cache = torch.full_like(k_cache, -128)
                k_scale = torch.full((nb, bs, kvh), float("nan"), device=DEV)
                v_scale = torch.full_like(k_scale, float("nan"))
                pthfa.quantize_kv(key, value, k_cache, v_cache, k_scale, v_scale, slots)
                torch.cuda.synchronize()
                live = slots >= 0
                s = slots[live]
                for src, cache, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
                    flat_c = cache.view(nb * bs, kvh, d)
                    flat_s = scale.view(nb * bs, kvh)
                    got_q, got_s = flat_c[s], flat_s[s]
                    want_q, want_s = quantize_ref(src[live])
                    # torch divides by a scalar through its reciprocal: allow 1 ulp
                    torch.testing.assert_close(got_s, want_s, rtol=2.5e-7, atol=0)
                    diff = (got_q.int() - want_q.int()).abs()
                    assert int(diff.max()) <= 1, (name, d, bs)
                    assert int((diff > 0).sum()) <= diff.numel() // 1000, (name, d, bs)
                    err = (got_q.double() * got_s.double()[..., None] - src[live].double()).abs()
                    bound = got_s.double()[..., None] * (0.5 + 1e-4)
                    assert bool((err <= bound).all()), (name, d, bs, float((err - bound).max()))
                    # untouched slots keep their poison
                    mask = torch.ones(nb * bs, dtype=torch.bool, device=DEV)
                    mask[s] = False
                    assert bool((flat_c[mask] == -128).all())
                    assert bool(flat_s[mask].isnan().all())
                    assert int(got_q.min()) >= -127
                    worst = float((err / got_s.double()[..., None].clamp_min(1e-30)).max())
                RESULTS.append(f"quantize {name} d{d} bs{bs}: tokens {n} (skipped "
                               f"{int(skip.sum())}), max |x - q*s| / s = {worst:.4f}")


def test_quantize_strided_view() -> None:
    """A [tokens, kv_heads, head_dim] view of a fused qkv buffer (token stride > row)."""
    gen = torch.Generator(device=DEV).manual_seed(2)
    n, kvh, d, bs, nb = 50, 2, 128, 16, 8
    qkv = torch.randn((n, 6 * kvh * d), generator=gen, device=DEV).to(torch.bfloat16)
    key = qkv[:, 4 * kvh * d: 5 * kvh * d].view(n, kvh, d)
    value = qkv[:, 5 * kvh * d:].view(n, kvh, d)
    assert not key.is_contiguous()
    slots = torch.arange(n, device=DEV, dtype=torch.int64) + 3
    kc = torch.full((nb, bs, kvh, d), -128, dtype=torch.int8, device=DEV)
    vc = torch.full_like(kc, -128)
    ks = torch.full((nb, bs, kvh), float("nan"), device=DEV)
    vs = torch.full_like(ks, float("nan"))
    pthfa.quantize_kv(key, value, kc, vc, ks, vs, slots)
    for src, c, sc in ((key, kc, ks), (value, vc, vs)):
        wq, ws = quantize_ref(src)
        torch.testing.assert_close(sc.view(-1, kvh)[slots], ws, rtol=2.5e-7, atol=0)
        assert int((c.view(-1, kvh, d)[slots].int() - wq.int()).abs().max()) <= 1


def _decode_case(seq_lens: list[int], kvh: int, g: int, d: int, bs: int, name: str,
                 seed: int, part_size: int | None = None, dev: str = DEV) -> str:
    dtype = DTYPES[name]
    gen = torch.Generator(device=dev).manual_seed(seed)
    s = len(seq_lens)
    h = kvh * g
    nblks = [math.ceil(n / bs) for n in seq_lens]
    max_blocks = max(*nblks, 1) + 2
    total = sum(nblks) + 5
    perm = torch.randperm(total, generator=gen, device=dev).to(torch.int32)
    # entries past a sequence's end hold valid but foreign blocks: reading them would show
    block_tables = torch.randint(0, total, (s, max_blocks), generator=gen, device=dev,
                                 dtype=torch.int32)
    keys, values, slots = [], [], []
    at = 0
    for i, n in enumerate(seq_lens):
        block_tables[i, : nblks[i]] = perm[at: at + nblks[i]]
        at += nblks[i]
        t = torch.arange(n, device=dev)
        slots.append(block_tables[i, t // bs].long() * bs + t % bs)
        keys.append(_rows(n, kvh, d, dtype, gen))
        values.append(_rows(n, kvh, d, dtype, gen))
    k_cache = torch.randint(-127, 128, (total, bs, kvh, d), generator=gen, device=dev,
                            dtype=torch.int8)
    v_cache = torch.randint(-127, 128, (total, bs, kvh, d), generator=gen, device=dev,
                            dtype=torch.int8)
    k_scale = torch.rand((total, bs, kvh), generator=gen, device=dev) + 0.5
    v_scale = torch.rand((total, bs, kvh), generator=gen, device=dev) + 0.5
    pthfa.quantize_kv(torch.cat(keys), torch.cat(values), k_cache, v_cache, k_scale, v_scale,
                      torch.cat(slots))
    query = (2.0 * torch.randn((s, h, d), generator=gen, device=dev)).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
    out = torch.full((s, h, d), float("nan"), dtype=dtype, device=dev)
    pthfa.decode(query, k_cache, v_cache, k_scale, v_scale, block_tables, lens,
                 max_seq_len=max(seq_lens), out=out, part_size=part_size)
    torch.cuda.synchronize()
    assert not bool(out.isnan().any()), "unwritten (NaN) output elements"

    deq_k = [gather_kv(k_cache, k_scale, block_tables[i], n) for i, n in enumerate(seq_lens)]
    deq_v = [gather_kv(v_cache, v_scale, block_tables[i], n) for i, n in enumerate(seq_lens)]
    ref_deq = attention_ref(query, deq_k, deq_v)
    ref_full = attention_ref(query, keys, values)
    live = [i for i, n in enumerate(seq_lens) if n > 0]
    for i, n in enumerate(seq_lens):
        if n == 0:
            assert bool((out[i] == 0).all()), "an empty sequence must give zeros"
    o, rd, rf = out[live], ref_deq[live], ref_full[live]
    # fp32 terms: the kernel's output against the dequantized reference rounded to the dtype
    e_round = _rel(o, rd.to(dtype))
    e_deq = _rel(o, rd)
    e_full = _rel(o, rf)
    e_quant = _rel(rd, rf)  # what int8 alone costs
    assert e_round < 1e-3, f"vs dequantized reference (rounded to {name}): {e_round:.2e}"
    assert e_deq < 1e-3 + ROUND[name], f"vs dequantized reference: {e_deq:.2e}"
    assert e_full <= e_quant + 1e-3 + ROUND[name], (e_full, e_quant)
    assert e_full < 5e-2, f"vs full precision: {e_full:.2e}"
    return (f"decode {name} d{d} g{g} kvh{kvh} bs{bs} lens={seq_lens}"
            f"{'' if part_size is None else f' part={part_size}'}: "
            f"rel err vs deq (rounded) {e_round:.2e}, vs deq {e_deq:.2e}, vs full {e_full:.2e} "
            f"(int8 alone {e_quant:.2e})")


RAGGED = [1, 17, 100, 513, 1500, 4097]


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("g", [1, 4, 8])
@pytest.mark.parametrize("bs", [16, 32])
def test_decode_ragged(d: int, g: int, bs: int) -> None:
    name = "bf16" if (d // 64 + g + bs // 16) % 2 else "fp16"
    RESULTS.append(_decode_case(RAGGED, 2, g, d, bs, name, seed=d * 100 + g * 10 + bs))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_decode_long(name: str) -> None:
    RESULTS.append(_decode_case([32768, 3, 20000], 2, 4, 128, 16, name, seed=7))
    RESULTS.append(_decode_case([32768], 1, 8, 256, 32, name, seed=8))


@pytest.mark.parametrize("part", [16, 32, 64, 512])
def test_decode_partition_sizes(part: int) -> None:
    bs = 16 if part < 32 else 32
    bs = min(bs, part)
    RESULTS.append(_decode_case([1, 31, 32, 33, 700, 2049], 2, 4, 128, bs, "bf16", seed=part,
                                part_size=part))


@pytest.mark.parametrize("bs", [1, 8])
def test_decode_small_blocks(bs: int) -> None:
    """block_size < 16: a 16-token step spans several blocks (the per-row block-table path)."""
    RESULTS.append(_decode_case([1, 17, 100, 513, 1500, 3000], 2, 4, 128, bs, "bf16",
                                seed=50 + bs))


@pytest.mark.parametrize("part", [1360, 2720])
def test_decode_uneven_partitions(part: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions that are not a power of two ($PTHFA_PART_SIZE, the measurement knob)."""
    monkeypatch.setenv("PTHFA_PART_SIZE", str(part))
    pthfa.reload_env()  # the knobs are read once
    try:
        RESULTS.append(f"PTHFA_PART_SIZE={part}: " + _decode_case(
            [1, 1359, 1361, 2720, 2721, 9000], 2, 8, 128, 16, "bf16", seed=part))
    finally:
        monkeypatch.delenv("PTHFA_PART_SIZE")
        pthfa.reload_env()


@pytest.mark.parametrize("g,bs,name,part", [
    (1, 16, "fp16", None), (2, 64, "bf16", None), (4, 16, "bf16", 16), (4, 32, "fp16", 64),
    (8, 16, "bf16", 2048), (4, 256, "bf16", None)])
def test_decode_eight_kv_heads(g: int, bs: int, name: str, part: int | None) -> None:
    """8 KV heads of 128 dims, the shape the whole-block kernels (ws3, wb4, ...) are built for:
    every GQA ratio, blocks of 16 to 256 tokens, one-step partitions, partitions that end
    inside a block and sequences shorter than a step (so that the kernel forced by
    $PTHFA_IMPL, or picked by the default dispatch, runs its edges)."""
    RESULTS.append(_decode_case([0, 1, 15, 16, 17, 95, 97, 1000, 4111], 8, g, 128, bs, name,
                                seed=900 + 10 * g + bs, part_size=part))


def test_decode_default_whole_block_region() -> None:
    """A batch in the region where the default dispatch takes the split whole-block kernel
    (8 sequences, max_seq_len 16384: 2**17 tokens; wt6 on sm_90), ragged and with an empty
    sequence; without $PTHFA_IMPL the plan must name that kernel."""
    from pthfa import _knobs, _plan

    lens = [16384, 0, 1, 17, 5000, 16000, 9999, 300]
    if not _knobs.knobs().impl:
        major = torch.cuda.get_device_capability()[0]
        impl = _plan.plan(len(lens), 8, max(lens), 16, 4, 128, 132, major)[0]
        assert impl == ("wt6" if major >= 9 else "cp3"), impl
    RESULTS.append(_decode_case(lens, 8, 4, 128, 16, "bf16", seed=77))


def test_decode_qwen3_8b_shape_and_empty_seq() -> None:
    lens = [8192, 0, 5, 4000, 7777, 1, 6000, 8191]
    RESULTS.append(_decode_case(lens, 8, 4, 128, 16, "bf16", seed=11))


def test_decode_rejects_bad_args_on_gpu() -> None:
    q = torch.randn((2, 8, 128), device=DEV, dtype=torch.bfloat16)
    kc = torch.zeros((4, 16, 2, 128), dtype=torch.int8, device=DEV)
    sc = torch.ones((4, 16, 2), device=DEV)
    bt = torch.zeros((2, 4), dtype=torch.int32, device=DEV)
    lens = torch.ones(2, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"seq_lens must have dtype torch\.int32"):
        pthfa.decode(q, kc, kc, sc, sc, bt, lens.long())
    with pytest.raises(ValueError, match="CUDA device"):
        pthfa.decode(q.cpu(), kc, kc, sc, sc, bt, lens)
    with pytest.raises(ValueError, match="query must be contiguous"):
        pthfa.decode(q.transpose(0, 1).contiguous().transpose(0, 1), kc, kc, sc, sc, bt, lens)


class _Seqs:
    """Two sequences over one quantized cache (the same 600 tokens), for tests that call
    decode again and again on the same tensors, as serving does."""

    def __init__(self, seed: int, kvh: int = 2, g: int = 4, d: int = 128, bs: int = 16,
                 n_max: int = 600) -> None:
        gen = torch.Generator(device=DEV).manual_seed(seed)
        self.gen, self.kvh, self.h, self.d, self.bs = gen, kvh, kvh * g, d, bs
        nb = n_max // bs + 4
        self.tables = torch.randperm(nb, generator=gen, device=DEV).to(torch.int32).repeat(2, 1)
        t = torch.arange(n_max, device=DEV)
        self.k_cache = torch.zeros((nb, bs, kvh, d), dtype=torch.int8, device=DEV)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.k_scale = torch.zeros((nb, bs, kvh), device=DEV)
        self.v_scale = torch.zeros_like(self.k_scale)
        slots = self.tables[0, t // bs].long() * bs + t % bs
        pthfa.quantize_kv(_rows(n_max, kvh, d, torch.bfloat16, gen),
                          _rows(n_max, kvh, d, torch.bfloat16, gen), self.k_cache, self.v_cache,
                          self.k_scale, self.v_scale, slots)
        self.lens = torch.zeros(2, dtype=torch.int32, device=DEV)

    def query(self, s: int = 2, dtype: Any = torch.bfloat16) -> Any:
        return (2.0 * torch.randn((s, self.h, self.d), generator=self.gen,
                                  device=DEV)).to(dtype)

    def cache(self) -> tuple[Any, Any, Any, Any]:
        return self.k_cache, self.v_cache, self.k_scale, self.v_scale

    def check(self, query: Any, out: Any, n: int) -> float:
        k = [gather_kv(self.k_cache, self.k_scale, self.tables[i], n) for i in range(len(out))]
        v = [gather_kv(self.v_cache, self.v_scale, self.tables[i], n) for i in range(len(out))]
        err = _rel(out, attention_ref(query, k, v).to(out.dtype))
        assert err < 1e-3, (n, err)
        return err


def test_fast_path_same_tensors_every_step() -> None:
    """After a first call the checks and plans are remembered: the steps of a generation
    (seq_lens and max_seq_len + 23 a step, one plan per bucket), a bound above the true
    length, a new dtype, a new shape and a new partition size each match the reference, and
    a bad call after good ones is still refused."""
    x = _Seqs(seed=60)
    q = x.query()
    worst = 0.0
    for n in range(100, 600, 23):
        x.lens.fill_(n)
        out = pthfa.decode(q, *x.cache(), x.tables, x.lens, max_seq_len=n)
        worst = max(worst, x.check(q, out, n))
    x.lens.fill_(100)
    worst = max(worst, x.check(q, pthfa.decode(q, *x.cache(), x.tables, x.lens,
                                               max_seq_len=600), 100))
    q16 = x.query(dtype=torch.float16)
    worst = max(worst, x.check(q16, pthfa.decode(q16, *x.cache(), x.tables, x.lens,
                                                 max_seq_len=100), 100))
    q1 = x.query(s=1)
    worst = max(worst, x.check(q1, pthfa.decode(q1, *x.cache(), x.tables[:1], x.lens[:1],
                                                max_seq_len=100), 100))
    worst = max(worst, x.check(q, pthfa.decode(q, *x.cache(), x.tables, x.lens,
                                               max_seq_len=100, part_size=32), 100))
    with pytest.raises(ValueError, match="block_tables must have dtype"):
        pthfa.decode(q, *x.cache(), x.tables.long(), x.lens, max_seq_len=100)
    with pytest.raises(ValueError, match="max_seq_len"):
        pthfa.decode(q, *x.cache(), x.tables, x.lens, max_seq_len=10**6)
    RESULTS.append(f"fast path, same tensors every step: worst rel err {worst:.2e}")


def test_graph_capture_with_eager_calls_between_replays() -> None:
    """quantize_kv (one new token a step) and decode captured in one CUDA graph; between
    replays, eager calls of another shape on the same stream must not disturb the graph's
    scratch, and every replay matches the reference over the cache it just extended."""
    x = _Seqs(seed=61)
    q = x.query()
    out = torch.empty_like(q)
    new_k = _rows(1, x.kvh, x.d, torch.bfloat16, x.gen)
    new_v = _rows(1, x.kvh, x.d, torch.bfloat16, x.gen)
    slot = torch.zeros(1, dtype=torch.int64, device=DEV)

    def step() -> None:
        pthfa.quantize_kv(new_k, new_v, *x.cache(), slot)
        pthfa.decode(q, *x.cache(), x.tables, x.lens, max_seq_len=640, out=out)

    x.lens.fill_(300)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call,unused-ignore]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    q1 = x.query(s=1)
    for n in (300, 301, 450):
        q.copy_(x.query())
        new_k.copy_(_rows(1, x.kvh, x.d, torch.bfloat16, x.gen))
        new_v.copy_(_rows(1, x.kvh, x.d, torch.bfloat16, x.gen))
        slot.fill_(int(x.tables[0, n // x.bs]) * x.bs + n % x.bs)  # token n, appended
        x.lens.fill_(n + 1)
        eager = pthfa.decode(q1, *x.cache(), x.tables[:1], x.lens[:1], max_seq_len=n + 1)
        graph.replay()
        torch.cuda.synchronize()
        x.check(q, out, n + 1)
        x.check(q1, eager, n + 1)
        want_q, _ = quantize_ref(new_k)
        row = x.k_cache.view(-1, x.kvh, x.d)[int(slot)]
        assert int((row.int() - want_q[0].int()).abs().max()) <= 1
    RESULTS.append("graph capture: quantize_kv + decode replayed 3 times with eager calls "
                   "between: every replay matches")


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="one GPU visible: per-device kernel handles need two")
def test_two_devices_keep_their_own_handles() -> None:
    """The same kernels on cuda:0 and cuda:1, the current device being either: each device
    gets its own loaded module and function handle, and both give the reference."""
    from pthfa import _driver as D

    for dev, current in (("cuda:1", 0), ("cuda:1", 1), ("cuda:0", 1), ("cuda:0", 0)):
        with torch.cuda.device(current):
            RESULTS.append(f"{dev} (current {current}): " + _decode_case(
                [1, 700, 3000], 2, 4, 128, 16, "bf16", seed=70, dev=dev))
    names = {n for (_d, n) in D._KERNELS}
    for name in names:
        if (0, name) in D._KERNELS and (1, name) in D._KERNELS:
            assert D._KERNELS[(0, name)].fn != D._KERNELS[(1, name)].fn


def test_zz_report() -> None:
    """Prints every case's numbers (pytest -s or -rA shows them)."""
    dev = torch.cuda.get_device_name()
    cc = torch.cuda.get_device_capability()
    sys.stdout.write(f"\n# pthfa GPU results on {dev} (sm_{cc[0]}{cc[1]}), torch "
                     f"{torch.__version__}\n")
    for line in RESULTS:
        sys.stdout.write(line + "\n")
    assert RESULTS
