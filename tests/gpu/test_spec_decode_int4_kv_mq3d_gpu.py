"""spec-decode-int4-kv-mq3d on a real GPU (marker ``gpu``): verify batches over the int4
per-token-head cache (written by vLLM's own ``reshape_and_cache_int4`` into 0.32.0's layout)
through ``unified_attention`` with ``VLLM_INT4_MQ_3D`` on and the 3D scratch handed in (sized
in tokens, NaN-poisoned), against the same batch on the 2D path (knob off).

Checks: the 3D path was taken (the scratch was written) and 3D agrees with 2D to the bf16
output's rounding (``bf16_agree``): per (token, head) row, ||3D - 2D|| <= 2^-6 x ||2D||. The
int4 wrapper rounds twice, the kernel's output to bf16 (under one step per element; the
orthonormal inverse rotation keeps the row norm of that difference) and the rotated result
(one more step), so two bf16 steps, 2^-7 of the row norm, bound an exact pair; 2^-6 leaves
room for the fp32 sums in another order, and a wrong 3D path misses it by orders of
magnitude. The series spec's 1e-3 x max |out| is below bf16's step: the H200 run of
2026-12-01 measured max |3D - 2D| of 2.3e-3 to 7.9e-3 x max |out|. Both against fp32 attention on the bf16 sources within int4's own error (rel <= 0.2,
3D no worse than 2D by more than 1e-3). A padded zero-length row over NaN scratch is exactly 0
and no output is NaN, in a 3D verify batch and in a 3D decode batch (which 0.32.0 already ran
on 3D: there the row reduced unwritten scratch). 3D vs 2D time at kv 128k, q 8. On the tree
cut before the patch the verify batches stay on 2D (the scratch stays NaN) and the decode
batch's padded row is not 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from .vllm_tree import record, require_cuda

pytestmark = pytest.mark.gpu
torch = require_cuda()

import triton.testing  # noqa: E402

from . import vllm_tree  # noqa: E402
from .attn_ref import bf16_agree, int4_cache, make_batch, reference, rel  # noqa: E402

DEV = "cuda"
LINES: list[str] = []


@pytest.fixture(scope="module")
def mods() -> Any:
    vllm_tree.install()
    ua = vllm_tree.load("vllm.v1.attention.ops.triton_unified_attention")
    i4 = vllm_tree.load("vllm.v1.attention.ops.int4_per_token_head")
    mode = vllm_tree.load("vllm.v1.kv_cache_interface").KVQuantMode
    return ua, i4, mode


def scratch(tokens: int, hq: int, d: int) -> dict[str, Any]:
    """The three 3D buffers (16 segments), NaN-filled: an unwritten read shows."""
    nan = float("nan")
    return {"softmax_segm_output": torch.full((tokens, hq, 16, d), nan, device=DEV),
            "softmax_segm_max": torch.full((tokens, hq, 16), nan, device=DEV),
            "softmax_segm_expsum": torch.full((tokens, hq, 16), nan, device=DEV)}


def run(ua: Any, mode: Any, b: Any, cache: Any, buffers: dict[str, Any] | None,
        threshold: int = 64) -> Any:
    key, value, ks, vs = cache
    out = torch.full_like(b.q, float("nan"))
    extra: dict[str, Any] = {}
    if buffers is not None:
        extra = dict(seq_threshold_3D=threshold, num_par_softmax_segments=16, **buffers)
    ua.unified_attention(
        q=b.q, k=key, v=value, out=out, cu_seqlens_q=b.cu_seqlens_q, max_seqlen_q=b.max_q,
        seqused_k=b.seq_lens, max_seqlen_k=b.max_kv, softmax_scale=b.q.shape[-1] ** -0.5,
        causal=True, window_size=(-1, -1), block_table=b.block_table, softcap=0,
        q_descale=None, k_descale=None, v_descale=None,
        kv_quant_mode=mode.INT4_PER_TOKEN_HEAD, k_scale_cache=ks, v_scale_cache=vs, **extra)
    return out


# (q lens, kv lens, Hq, Hkv, D): q 2-16, kv 1 to 128k, 1-8 sequences
CASES = [
    ([8], [1500], 16, 4, 128),
    ([2, 5, 16, 1], [40, 700, 3000, 1], 16, 4, 128),
    ([8] * 8, [100, 2000, 17, 16, 15, 9000, 300, 64], 32, 8, 128),
    ([4, 16], [25000, 600], 24, 4, 256),
    ([8], [131072], 16, 4, 128),
]


@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_3d_matches_2d(mods: Any, case: Any, monkeypatch: Any) -> None:
    ua, i4, mode = mods
    q_lens, kv_lens, hq, hkv, d = case
    gen = torch.Generator(device=DEV).manual_seed(700 + len(LINES))
    b = make_batch(q_lens, kv_lens, hq, hkv, d, 16, torch.bfloat16, gen)
    cache = int4_cache(i4, b)
    monkeypatch.setenv("VLLM_INT4_MQ_3D", "0")
    out2 = run(ua, mode, b, cache, scratch(b.q.shape[0], hq, d))
    monkeypatch.setenv("VLLM_INT4_MQ_3D", "1")
    buffers = scratch(b.q.shape[0], hq, d)
    out3 = run(ua, mode, b, cache, buffers)
    assert not buffers["softmax_segm_max"].isnan().all(), "3D not taken: scratch unwritten"
    assert not out3.isnan().any() and not out2.isnan().any()
    diff = float((out3.float() - out2.float()).abs().max())
    scale = float(out2.float().abs().max())
    r32 = bf16_agree(out3, out2)
    ref = reference(b, d ** -0.5)
    r2, r3 = rel(out2, ref), rel(out3, ref)
    assert r3 <= 0.2 and r3 <= r2 + 1e-3, (r3, r2)
    LINES.append(f"| {q_lens} | {kv_lens} | {hq}/{hkv}/{d} | {diff:.2e} ({diff / scale:.1e} "
                 f"of max; worst row {r32:.1e} of its norm) | {r3:.4f} | {r2:.4f} |")


def test_zero_length_row_in_3d(mods: Any, monkeypatch: Any) -> None:
    """A padded sequence (query 1, kv 0) in a 3D verify batch over NaN scratch."""
    ua, i4, mode = mods
    gen = torch.Generator(device=DEV).manual_seed(9)
    b = make_batch([4, 4, 1], [500, 300, 1], 16, 4, 128, 16, torch.bfloat16, gen)
    cache = int4_cache(i4, b)
    b.seq_lens[2] = 0  # the padding row: nothing to attend
    monkeypatch.setenv("VLLM_INT4_MQ_3D", "1")
    buffers = scratch(b.q.shape[0], 16, 128)
    out = run(ua, mode, b, cache, buffers)
    assert not buffers["softmax_segm_max"].isnan().all(), "3D not taken: scratch unwritten"
    assert not out.isnan().any(), "NaN in the output"
    assert torch.equal(out[8], torch.zeros_like(out[8])), "the padded row is not 0"
    LINES.append("| padded zero-length row, NaN scratch | | | row exactly 0, no NaN | | |")


def test_zero_length_row_in_3d_decode(mods: Any) -> None:
    """The same padding in a decode batch, which 0.32.0 already runs on 3D."""
    ua, i4, mode = mods
    gen = torch.Generator(device=DEV).manual_seed(10)
    b = make_batch([1, 1, 1], [900, 40, 1], 16, 4, 128, 16, torch.bfloat16, gen)
    cache = int4_cache(i4, b)
    b.seq_lens[2] = 0
    buffers = scratch(b.q.shape[0], 16, 128)
    out = run(ua, mode, b, cache, buffers)
    assert not buffers["softmax_segm_max"].isnan().all(), "3D not taken: scratch unwritten"
    assert torch.equal(out[2], torch.zeros_like(out[2])), (
        f"the padded row is not 0 ({int(out[2].isnan().sum())} NaN)")
    assert not out.isnan().any(), "NaN in the output"
    LINES.append("| decode batch with a padded zero-length row, NaN scratch | | | row exactly "
                 "0, no NaN | | |")


def test_speed_128k(mods: Any, monkeypatch: Any) -> None:
    ua, i4, mode = mods
    rows = []
    for hq, hkv, d in ((16, 4, 128), (24, 4, 256)):
        gen = torch.Generator(device=DEV).manual_seed(11)
        b = make_batch([8], [131072], hq, hkv, d, 16, torch.bfloat16, gen)
        cache = int4_cache(i4, b)
        buffers = scratch(8, hq, d)
        monkeypatch.setenv("VLLM_INT4_MQ_3D", "1")
        run(ua, mode, b, cache, buffers)
        assert not buffers["softmax_segm_max"].isnan().all(), "3D not taken: scratch unwritten"
        times = {}
        for flag in ("0", "1"):
            monkeypatch.setenv("VLLM_INT4_MQ_3D", flag)
            times[flag] = triton.testing.do_bench(
                lambda b=b, cache=cache, buffers=buffers: run(ua, mode, b, cache, buffers),
                warmup=25, rep=200)
        rows.append(f"| {hq}/{hkv}/{d} | 131072 | 8 | {times['1'] * 1e3:,.0f} | "
                    f"{times['0'] * 1e3:,.0f} | {times['0'] / times['1']:.1f}x |")
        assert times["1"] < times["0"], times
    record("spec_decode_int4_kv_mq3d", [
        "Verify batches over the int4 per-token-head cache (`reshape_and_cache_int4`), "
        "`unified_attention` with `VLLM_INT4_MQ_3D`=1 (3D) vs 0 (2D), same inputs; rel vs "
        "fp32 attention on the bf16 sources (int4's own error).", "",
        "| q lens | kv lens | Hq/Hkv/D | max abs 3D-2D | rel 3D | rel 2D |",
        "|---|---|---|---|---|---|", *LINES, "",
        "us per call (`triton.testing.do_bench` median, whole `unified_attention`: Q "
        "rotation, kernel, reduce, inverse rotation):", "",
        "| Hq/Hkv/D | kv | q | 3D | 2D | speed-up |", "|---|---:|---:|---:|---:|---:|", *rows])
