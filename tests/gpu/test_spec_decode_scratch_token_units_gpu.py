"""spec-decode-scratch-token-units on a real GPU (marker ``gpu``): vLLM's real TRITON_ATTN
metadata builder (triton_attn.py, the engine stubbed, a fake config with FULL graphs and
capture sizes 1/2/4/8, so the 3D threshold snaps to 8 sequences) on the CUDA device, its
scratch handed to ``unified_attention`` for an int4 verify batch of 9 query tokens with
``VLLM_INT4_MQ_3D`` on.

Checks: the builder's ``torch.cuda.memory_allocated`` delta is rows x row bytes (rows = the
token capacity, 128 here); the q = 9 batch takes the 3D path (the scratch, NaN-poisoned, is
written) and matches the 2D path to the bf16 output's rounding (per row ||3D - 2D|| <= 2^-6
x ||2D||; see test_spec_decode_int4_kv_mq3d_gpu.py). On the tree cut before the patch the
scratch has 8 rows (sequences) and the batch stays on 2D.
"""

from __future__ import annotations

from typing import Any

import pytest

from .vllm_tree import record, require_cuda

pytestmark = pytest.mark.gpu
torch = require_cuda()

from tests.patches import _triton_builder as tb  # noqa: E402

from . import vllm_tree  # noqa: E402
from .attn_ref import bf16_agree, int4_cache, make_batch  # noqa: E402

DEV = "cuda"
HQ, HKV, D = 16, 4, 128


@pytest.fixture(scope="module")
def mods() -> Any:
    root = vllm_tree.install()
    ua = vllm_tree.load("vllm.v1.attention.ops.triton_unified_attention")
    i4 = vllm_tree.load("vllm.v1.attention.ops.int4_per_token_head")
    mode = vllm_tree.load("vllm.v1.kv_cache_interface").KVQuantMode
    return tb.load(root / "vllm"), ua, i4, mode


def test_builder_bytes_and_q9_takes_3d(mods: Any, monkeypatch: Any) -> None:
    ta, ua, i4, mode = mods
    cfg = tb.fake_config(hq=HQ, hkv=HKV, d=D, max_num_seqs=8, max_num_batched_tokens=2048,
                         capture_sizes=[1, 2, 4, 8])
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    b = tb.builder(ta, cfg, DEV)
    delta = torch.cuda.memory_allocated() - before
    rows = b.softmax_segm_max.shape[0]
    row_bytes = 4 * (HQ * 16 * D + 2 * HQ * 16)
    assert b.seq_threshold_3D == 8
    assert delta == rows * row_bytes, (delta, rows, row_bytes)
    assert rows >= 9 * 8 and rows == b.scratch_token_capacity_3d == 128, rows

    gen = torch.Generator(device=DEV).manual_seed(21)
    batch = make_batch([9], [5000], HQ, HKV, D, 16, torch.bfloat16, gen)
    cache = int4_cache(i4, batch)
    key, value, ks, vs = cache

    def run() -> Any:
        out = torch.full_like(batch.q, float("nan"))
        ua.unified_attention(
            q=batch.q, k=key, v=value, out=out, cu_seqlens_q=batch.cu_seqlens_q,
            max_seqlen_q=9, seqused_k=batch.seq_lens, max_seqlen_k=batch.max_kv,
            softmax_scale=D ** -0.5, causal=True, window_size=(-1, -1),
            block_table=batch.block_table, softcap=0, q_descale=None, k_descale=None,
            v_descale=None, kv_quant_mode=mode.INT4_PER_TOKEN_HEAD, k_scale_cache=ks,
            v_scale_cache=vs, seq_threshold_3D=b.seq_threshold_3D,
            num_par_softmax_segments=b.num_par_softmax_segments,
            softmax_segm_output=b.softmax_segm_output, softmax_segm_max=b.softmax_segm_max,
            softmax_segm_expsum=b.softmax_segm_expsum,
            **({"max_query_len_3d": b.max_query_len_3d,
                "scratch_token_capacity_3d": b.scratch_token_capacity_3d}
               if hasattr(b, "max_query_len_3d") else {}))
        return out

    monkeypatch.setenv("VLLM_INT4_MQ_3D", "0")
    out2 = run()
    b.softmax_segm_max.fill_(float("nan"))
    monkeypatch.setenv("VLLM_INT4_MQ_3D", "1")
    out3 = run()
    taken = not bool(b.softmax_segm_max[:9].isnan().all())
    diff = float((out3.float() - out2.float()).abs().max())
    record("spec_decode_scratch_token_units", [
        f"Builder (Hq/Hkv/D {HQ}/{HKV}/{D}, max_num_seqs 8, max_num_batched_tokens 2048, "
        f"capture sizes 1/2/4/8): threshold {b.seq_threshold_3D} sequences, scratch {rows} "
        f"token rows, memory_allocated +{delta:,} B = {rows} x {row_bytes:,} B "
        f"({delta / 2**20:.2f} MiB).",
        f"int4 verify batch, 1 sequence x 9 query tokens, kv 5000, VLLM_INT4_MQ_3D=1: "
        f"3D taken: {taken}; max |3D - 2D| {diff:.2e} (max |out| "
        f"{float(out2.float().abs().max()):.3f})."])
    assert taken, "the q = 9 batch stayed on 2D"
    bf16_agree(out3, out2)
