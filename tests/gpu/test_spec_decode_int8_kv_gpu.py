"""spec-decode-int8-kv on a real GPU (marker ``gpu``): the split-KV verify kernel over an
INT8_PER_TOKEN_HEAD cache laid out exactly as 0.32.0's TRITON_ATTN lays it out (raw
``[blocks, Hkv, page, 2(D+4)]`` int8, K/V views by transpose/split, fp32 scale views by
``as_strided`` at byte offsets D and 2D+4, as ``_ensure_scale_caches`` builds them), against
an fp32 reference on the dequantised cache and stock int8-PTH ``unified_attention``.

Tolerances (series-specs section 5): rel <= 1e-2, max |err| <= 1.5x stock's on the same data
(plus one bf16 ulp of the output's scale). On the tree cut before the patch the kernel takes
no scale caches: every kernel test fails.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from .vllm_tree import record, require_cuda

pytestmark = pytest.mark.gpu
torch = require_cuda()

from . import vllm_tree  # noqa: E402
from .attn_ref import PagedBatch, make_batch, max_err, reference, rel  # noqa: E402

DEV = "cuda"


@pytest.fixture(scope="module")
def mods() -> tuple[Any, ...]:
    vllm_tree.install()
    sda = vllm_tree.load("vllm.v1.attention.ops.spec_decode_attn")
    ua = vllm_tree.load("vllm.v1.attention.ops.triton_unified_attention")
    kvi = vllm_tree.load("vllm.v1.kv_cache_interface")
    return sda, ua, kvi.KVQuantMode


@dataclasses.dataclass
class Int8Cache:
    raw: Any  # [blocks, Hkv, page, 2(D+4)] int8
    key: Any  # [blocks, page, Hkv, D+4] int8 view
    value: Any
    k_scale: Any  # [blocks, page, Hkv] fp32 view into raw
    v_scale: Any
    deq: PagedBatch  # the same batch over the dequantised fp32 cache


def to_int8_pth(b: PagedBatch) -> Int8Cache:
    """Quantise the batch's bf16 cache per (token, head) by absmax into 0.32.0's layout."""
    nb, page, hkv, d = b.key_cache.shape
    pad = 4  # one fp32 scale in int8 elements
    raw = torch.empty((nb, hkv, page, 2 * (d + pad)), dtype=torch.int8, device=DEV)
    key, value = raw.transpose(1, 2).split(d + pad, dim=-1)
    f32 = torch.tensor([], dtype=torch.float32, device=DEV).set_(raw.untyped_storage())
    st = raw.stride()
    assert all(x % 4 == 0 for x in st[:3])
    view = dict(size=(nb, page, hkv), stride=(st[0] // 4, st[2] // 4, st[1] // 4))
    k_scale = torch.as_strided(f32, storage_offset=d // 4, **view)
    v_scale = torch.as_strided(f32, storage_offset=(d + pad + d) // 4, **view)
    deq = []
    for src, dst, scale in ((b.key_cache, key, k_scale), (b.value_cache, value, v_scale)):
        x = src.float()
        s = (x.abs().amax(-1) / 127).clamp_min(1e-8)
        qx = torch.round(x / s[..., None]).clamp(-127, 127).to(torch.int8)
        dst[..., :d].copy_(qx)
        scale.copy_(s)
        deq.append(dst[..., :d].float() * scale[..., None])
    # the scales sit in the bytes after each head's data, the data is untouched by them
    assert torch.equal(key[..., :d].float() * k_scale[..., None], deq[0])
    return Int8Cache(raw, key, value, k_scale, v_scale,
                     dataclasses.replace(b, key_cache=deq[0], value_cache=deq[1]))


def _ours(sda: Any, b: PagedBatch, c: Int8Cache, scale: float, buf: Any=None) -> Any:
    hq, d = b.q.shape[1], b.q.shape[2]
    buf = buf or sda.SpecDecodeAttnBuffers(len(b.q_lens), hq, d, max(16, b.max_q), DEV)
    out = torch.full_like(b.q, float("nan"))
    sda.spec_decode_attention(b.q, c.key, c.value, out, b.cu_seqlens_q, b.seq_lens,
                              b.block_table, b.max_q, scale, buf,
                              k_scale_cache=c.k_scale, v_scale_cache=c.v_scale)
    return out


def _stock(ua: Any, mode: Any, b: PagedBatch, c: Int8Cache, scale: float) -> Any:
    out = torch.full_like(b.q, float("nan"))
    ua.unified_attention(
        q=b.q, k=c.key, v=c.value, out=out, cu_seqlens_q=b.cu_seqlens_q,
        max_seqlen_q=b.max_q, seqused_k=b.seq_lens, max_seqlen_k=b.max_kv,
        softmax_scale=scale, causal=True, window_size=(-1, -1), block_table=b.block_table,
        softcap=0, q_descale=None, k_descale=None, v_descale=None,
        kv_quant_mode=mode.INT8_PER_TOKEN_HEAD, k_scale_cache=c.k_scale,
        v_scale_cache=c.v_scale)
    return out


# (q lens, kv lens, Hq, Hkv, D, page): odd and even KV heads (head stride 2(D+4) bytes),
# G 1-8, D 128/256, contexts to 128k, mixed batches.
CASES = [
    ([8], [1500], 16, 4, 128, 16),
    ([8, 3], [25000, 40], 24, 4, 256, 16),
    ([16], [131072], 16, 4, 128, 16),
    ([8], [131072], 24, 4, 256, 64),
    ([2, 5, 16, 1], [17, 900, 5000, 1], 8, 1, 128, 16),
    ([6, 4], [3000, 64], 16, 2, 128, 64),
    ([4], [2048], 16, 16, 128, 16),
]
RESULTS: list[str] = []
PERF: list[str] = []


@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_against_dequantised_reference_and_stock(mods: Any, case: Any) -> None:
    sda, ua, mode = mods
    q_lens, kv_lens, hq, hkv, d, page = case
    gen = torch.Generator(device=DEV).manual_seed(100 + len(RESULTS))
    b = make_batch(q_lens, kv_lens, hq, hkv, d, page, torch.bfloat16, gen)
    c = to_int8_pth(b)
    scale = d ** -0.5
    ref = reference(c.deq, scale)
    ours = _ours(sda, b, c, scale)
    stock = _stock(ua, mode, b, c, scale)
    assert not ours.isnan().any()
    e_ours, e_stock, r = max_err(ours, ref), max_err(stock, ref), rel(ours, ref)
    ulp = 2.0**-8 * float(ref.abs().max())
    # per KV head: odd heads sit at misaligned byte offsets
    per_head = []
    for h in range(hkv):
        rows = slice(h * (hq // hkv), (h + 1) * (hq // hkv))
        per_head.append(max_err(ours[:, rows], ref[:, rows]))
    RESULTS.append(f"| {q_lens} | {kv_lens} | {hq}/{hkv}/{d} | {page} | {e_ours:.2e} | "
                   f"{e_stock:.2e} | {r:.2e} | {max(per_head[1::2] or [0]):.2e} |")
    assert r <= 1e-2, r
    assert e_ours <= 1.5 * e_stock + ulp, (e_ours, e_stock)


def test_scales_are_read(mods: Any) -> None:
    """Doubling every K scale and halving every V scale changes the output (the kernel reads
    the inline scales, not a constant), and it follows the reference on the changed cache."""
    sda, _, _ = mods
    gen = torch.Generator(device=DEV).manual_seed(9)
    b = make_batch([8], [3000], 16, 4, 128, 16, torch.bfloat16, gen)
    c = to_int8_pth(b)
    before = _ours(sda, b, c, 0.2)
    c.v_scale.mul_(0.5)
    c.k_scale.mul_(2.0)
    after = _ours(sda, b, c, 0.2)
    kdq = c.key[..., :128].float() * c.k_scale[..., None]
    vdq = c.value[..., :128].float() * c.v_scale[..., None]
    ref = reference(dataclasses.replace(b, key_cache=kdq, value_cache=vdq), 0.2)
    assert max_err(after, before) > 0.05
    assert rel(after, ref) <= 1e-2


def _time_pair(sda: Any, ua: Any, mode: Any, shape: Any, kv: int, q: int, gen: Any) -> tuple[float, float]:
    import triton

    hq, hkv, d = shape
    b = make_batch([q], [kv], hq, hkv, d, 16, torch.bfloat16, gen)
    c = to_int8_pth(b)
    buf = sda.SpecDecodeAttnBuffers(1, hq, d, 16, DEV)
    out = torch.empty_like(b.q)

    def ours() -> None:
        sda.spec_decode_attention(b.q, c.key, c.value, out, b.cu_seqlens_q, b.seq_lens,
                                  b.block_table, q, d ** -0.5, buf,
                                  k_scale_cache=c.k_scale, v_scale_cache=c.v_scale)

    def stock() -> None:
        ua.unified_attention(
            q=b.q, k=c.key, v=c.value, out=out, cu_seqlens_q=b.cu_seqlens_q,
            max_seqlen_q=q, seqused_k=b.seq_lens, max_seqlen_k=kv, softmax_scale=d ** -0.5,
            causal=True, window_size=(-1, -1), block_table=b.block_table, softcap=0,
            q_descale=None, k_descale=None, v_descale=None,
            kv_quant_mode=mode.INT8_PER_TOKEN_HEAD, k_scale_cache=c.k_scale,
            v_scale_cache=c.v_scale)

    return (triton.testing.do_bench(ours, warmup=25, rep=100) * 1e3,
            triton.testing.do_bench(stock, warmup=25, rep=100) * 1e3)


@pytest.mark.parametrize("shape", [(24, 4, 256), (16, 4, 128)], ids=["24-4-256", "16-4-128"])
def test_speed_vs_stock(mods: Any, shape: Any) -> None:
    sda, ua, mode = mods
    gen = torch.Generator(device=DEV).manual_seed(4)
    for kv in (25000, 131072):
        for q in (8, 16):
            t_ours, t_stock = _time_pair(sda, ua, mode, shape, kv, q, gen)
            PERF.append(f"| {'/'.join(map(str, shape))} | {kv} | {q} | {t_ours:,.0f} | "
                        f"{t_stock:,.0f} | {t_stock / t_ours:.1f}x |")


def test_zz_record() -> None:
    lines = ["Numerics (int8 per-token-head cache in 0.32.0's layout, fp32 reference on the "
             "dequantised cache): max |err| of ours and of stock int8-PTH "
             "`unified_attention`, rel of ours, worst odd-KV-head max |err| of ours.", "",
             "| q lens | kv lens | Hq/Hkv/D | page | ours max | stock max | ours rel | "
             "odd heads max |", "|---|---|---|---|---|---|---|---|", *RESULTS, "",
             "Speed: us per call (`triton.testing.do_bench` median, CUDA events), batch 1, "
             "page 16.", "",
             "| Hq/Hkv/D | kv | q | split-KV int8 | stock int8-PTH | speed-up |",
             "|---|---|---|---|---|---|", *PERF]
    record("spec_decode_int8_kv", lines)
