"""spec-decode-attn on a real GPU (marker ``gpu``): the split-KV verify kernel of the patched
tree (v1/attention/ops/spec_decode_attn.py, loaded with harness H, no `vllm._C`) against an
fp32 torch reference and against stock 0.32.0 `unified_attention` on the same inputs.

Tolerances (series-specs section 4): max |err| <= 2e-2, rel <= 5e-3, and max |err| <= 1.5x
stock's on the same inputs (plus one bf16 ulp of the output's scale, so a case where both are
exact does not compare 0 with 0). Outputs are NaN-poisoned first. On a tree without the patch
every test fails (the module is missing): that is the series-cut proof.
"""

from __future__ import annotations

from typing import Any

import pytest

from .vllm_tree import record, require_cuda

pytestmark = pytest.mark.gpu
torch = require_cuda()

from . import vllm_tree  # noqa: E402
from .attn_ref import make_batch, max_err, reference, rel  # noqa: E402

DEV = "cuda"


@pytest.fixture(scope="module")
def mods() -> tuple[Any, ...]:
    vllm_tree.install()
    sda = vllm_tree.load("vllm.v1.attention.ops.spec_decode_attn")
    ua = vllm_tree.load("vllm.v1.attention.ops.triton_unified_attention")
    return sda, ua


def _ours(sda: Any, b: Any, scale: float, buf: Any=None, block_m: int = 0) -> Any:
    hq, d = b.q.shape[1], b.q.shape[2]
    if buf is None:
        buf = sda.SpecDecodeAttnBuffers(len(b.q_lens), hq, d, max(16, b.max_q), DEV)
    out = torch.full_like(b.q, float("nan"))
    sda.spec_decode_attention(b.q, b.key_cache, b.value_cache, out, b.cu_seqlens_q,
                              b.seq_lens, b.block_table, b.max_q, scale, buf, block_m)
    return out


def _stock(ua: Any, b: Any, scale: float) -> Any:
    out = torch.full_like(b.q, float("nan"))
    ones = torch.ones((len(b.q_lens), b.key_cache.shape[2]), device=DEV)
    ua.unified_attention(
        q=b.q, k=b.key_cache, v=b.value_cache, out=out, cu_seqlens_q=b.cu_seqlens_q,
        max_seqlen_q=b.max_q, seqused_k=b.seq_lens, max_seqlen_k=b.max_kv,
        softmax_scale=scale, causal=True, window_size=(-1, -1), block_table=b.block_table,
        softcap=0, q_descale=None, k_descale=ones, v_descale=ones)
    return out


# (q lens, kv lens, Hq, Hkv, D, page, high block id or None): covers D {128, 256},
# G {1, 4, 6, 8}, q {2, 5, 8, 16, 32, 64}, kv {1, 15, 16, 17, 1500, 25k, 128k}, pages 16/64,
# 1-8 requests with mixed q, and a block whose byte offset passes 2**31.
CASES = [
    ([8], [1500], 16, 4, 128, 16, None),
    ([2], [2], 8, 8, 128, 16, None),
    ([5, 1, 8], [15, 1, 16], 24, 4, 256, 16, None),
    ([16, 2], [17, 1500], 24, 4, 256, 64, None),
    ([32], [25000], 16, 2, 128, 64, None),
    ([64], [1500], 8, 1, 128, 16, None),
    ([8], [131072], 16, 4, 128, 16, None),
    ([8], [131072], 24, 4, 256, 64, None),
    ([2, 5, 8, 16, 3, 8, 1, 4], [1500, 17, 25000, 16, 15, 300, 1, 4096], 32, 4, 128, 16, None),
    ([4, 8, 2], [800, 2000, 64], 16, 4, 128, 16, 70000),  # 70000 x 32 KiB > 2**31 B
    ([6, 6], [40000, 999], 24, 4, 256, 16, None),
]


@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_against_reference_and_stock(mods: Any, case: Any) -> None:
    sda, ua = mods
    q_lens, kv_lens, hq, hkv, d, page, high = case
    gen = torch.Generator(device=DEV).manual_seed(len(RESULTS) + 11)
    b = make_batch(q_lens, kv_lens, hq, hkv, d, page, torch.bfloat16, gen, high_block=high)
    if high is not None:
        assert b.block_table.max().item() * b.kv_cache.stride(0) * 2 > 2**31
    scale = d ** -0.5
    ref = reference(b, scale)
    ours = _ours(sda, b, scale)
    stock = _stock(ua, b, scale)
    assert not ours.isnan().any()
    e_ours, e_stock = max_err(ours, ref), max_err(stock, ref)
    r = rel(ours, ref)
    ulp = 2.0**-8 * float(ref.abs().max())
    RESULTS.append(f"| {q_lens} | {kv_lens} | {hq}/{hkv}/{d} | {page} | {e_ours:.2e} | "
                   f"{e_stock:.2e} | {r:.2e} |")
    assert e_ours <= 2e-2 and r <= 5e-3, (e_ours, r)
    assert e_ours <= 1.5 * e_stock + ulp, (e_ours, e_stock)


def test_block_m_override(mods: Any) -> None:
    """VLLM_SPEC_ATTN_BLOCK_M's tiles (several query tiles per request) give the same rows."""
    sda, _ = mods
    gen = torch.Generator(device=DEV).manual_seed(5)
    b = make_batch([16, 9], [3000, 700], 24, 4, 128, 16, torch.bfloat16, gen)
    ref = reference(b, 0.1)
    for bm in (16, 32, 64, 128):
        out = _ours(sda, b, 0.1, block_m=bm)
        assert max_err(out, ref) <= 2e-2 and rel(out, ref) <= 5e-3, bm


def test_cuda_graph_capture(mods: Any) -> None:
    """Captured at q 8, replayed after new query and KV contents, equals eager; the
    buffers' addresses do not move after a later eager call at q = qmax."""
    sda, _ = mods
    gen = torch.Generator(device=DEV).manual_seed(7)
    b = make_batch([8, 8], [5000, 900], 16, 4, 128, 16, torch.bfloat16, gen)
    buf = sda.SpecDecodeAttnBuffers(4, 16, 128, 16, DEV)
    ptrs = (buf.part_o.data_ptr(), buf.part_m.data_ptr(), buf.part_l.data_ptr())
    out = torch.full_like(b.q, float("nan"))

    def run() -> None:
        sda.spec_decode_attention(b.q, b.key_cache, b.value_cache, out, b.cu_seqlens_q,
                                  b.seq_lens, b.block_table, 8, 0.125, buf)

    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    b.q.copy_(torch.randn(b.q.shape, generator=gen, device=DEV).to(b.q.dtype))
    b.kv_cache.mul_(-0.5)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()
    eager = _ours(sda, b, 0.125, buf)
    assert torch.equal(replayed, eager)
    assert max_err(eager, reference(b, 0.125)) <= 2e-2
    b16 = make_batch([16], [4000], 16, 4, 128, 16, torch.bfloat16, gen)
    _ours(sda, b16, 0.125, buf)
    assert (buf.part_o.data_ptr(), buf.part_m.data_ptr(), buf.part_l.data_ptr()) == ptrs


RESULTS: list[str] = []
PERF: list[str] = []


def _time_pair(sda: Any, ua: Any, shape: tuple[int, int, int], kv: int, q: int,
               gen: Any) -> tuple[float, float]:
    """us per call of (split-KV, stock 2D) on one request of q tokens over kv keys."""
    import triton

    hq, hkv, d = shape
    b = make_batch([q], [kv], hq, hkv, d, 16, torch.bfloat16, gen)
    buf = sda.SpecDecodeAttnBuffers(1, hq, d, 32, DEV)
    out = torch.empty_like(b.q)
    ones = torch.ones((1, hkv), device=DEV)

    def ours() -> None:
        sda.spec_decode_attention(b.q, b.key_cache, b.value_cache, out, b.cu_seqlens_q,
                                  b.seq_lens, b.block_table, q, d ** -0.5, buf)

    def stock() -> None:
        ua.unified_attention(
            q=b.q, k=b.key_cache, v=b.value_cache, out=out, cu_seqlens_q=b.cu_seqlens_q,
            max_seqlen_q=q, seqused_k=b.seq_lens, max_seqlen_k=kv, softmax_scale=d ** -0.5,
            causal=True, window_size=(-1, -1), block_table=b.block_table, softcap=0,
            q_descale=None, k_descale=ones, v_descale=ones)

    return (triton.testing.do_bench(ours, warmup=25, rep=100) * 1e3,
            triton.testing.do_bench(stock, warmup=25, rep=100) * 1e3)


@pytest.mark.parametrize("shape", [(24, 4, 256), (16, 4, 128)], ids=["24-4-256", "16-4-128"])
def test_speed_vs_stock(mods: Any, shape: Any) -> None:
    """us per layer call, batch 1, vs stock unified_attention (2D) on the same inputs."""
    sda, ua = mods
    gen = torch.Generator(device=DEV).manual_seed(3)
    for kv in (1500, 25000, 131072):
        for q in (5, 8, 16, 32):
            t_ours, t_stock = _time_pair(sda, ua, shape, kv, q, gen)
            PERF.append(f"| {'/'.join(map(str, shape))} | {kv} | {q} | {t_ours:,.0f} | "
                        f"{t_stock:,.0f} | {t_stock / t_ours:.1f}x |")


def test_zz_record() -> None:
    """Writes the tables (numerics of every case, speed) to the results."""
    lines = ["Numerics (bf16 cache, fp32 reference): max |err| of ours and of stock "
             "`unified_attention`, rel of ours.", "",
             "| q lens | kv lens | Hq/Hkv/D | page | ours max | stock max | ours rel |",
             "|---|---|---|---|---|---|---|", *RESULTS, "",
             "Speed: us per call (`triton.testing.do_bench` median, CUDA events), batch 1, "
             "page 16.", "",
             "| Hq/Hkv/D | kv | q | split-KV | stock 2D | speed-up |", "|---|---|---|---|---|---|",
             *PERF]
    record("spec_decode_attn", lines)
