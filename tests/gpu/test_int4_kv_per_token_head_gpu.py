"""int4-kv-per-token-head on a real GPU (marker ``gpu``): the INT4_PER_TOKEN_HEAD cache written
by vLLM's own ``reshape_and_cache_int4`` into 0.32.0's layout (raw ``[blocks, Hkv, page,
2(D/2 + 4)]`` uint8, views by transpose/split, fp32 scale views by ``as_strided`` as
``_ensure_scale_caches`` builds them), attended through ``unified_attention`` with a
per-sequence causal tensor mixing 0 and 1 (the DFlash2 drafter's), against the core kernel on
the bf16 sources (which supports per-sequence causal).

Tolerances: the spec's rel <= 0.1 is below int4's own error on Gaussian data (the H200 run of
2026-12-01 measured rel 0.13-0.15 against the core kernel on the bf16 sources, the causal
sequences included), so the bound is int4's error on the same data: rel of the per-sequence
run <= 1.25x rel of the causal int4 run against the causal core run. Each non-causal
sequence differs from its causal run (the flag is honoured) and is closer to the core
kernel's non-causal rows than the causal run is, while the causal ones agree; with
``causal=True`` the output is bit-equal to the pristine int4 kernel (defaults unchanged), with
and without a sliding window (the harness's pristine tree). On the tree
cut before the patch unified_attention asserts "causal only": the per-sequence tests fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from .vllm_tree import record, require_cuda

pytestmark = pytest.mark.gpu
torch = require_cuda()

from . import vllm_tree  # noqa: E402
from .attn_ref import int4_cache, make_batch, max_err, rel  # noqa: E402

DEV = "cuda"
LINES: list[str] = []


def _load() -> Any:
    ua = vllm_tree.load("vllm.v1.attention.ops.triton_unified_attention")
    i4 = vllm_tree.load("vllm.v1.attention.ops.int4_per_token_head")
    mode = vllm_tree.load("vllm.v1.kv_cache_interface").KVQuantMode
    return ua, i4, mode


@pytest.fixture(scope="module")
def mods() -> Any:
    vllm_tree.install()
    return _load()


def _attn(ua: Any, mode: Any, b: Any, causal: Any, window: Any=(-1, -1), int4: Any=None) -> Any:
    out = torch.full_like(b.q, float("nan"))
    kw = dict(q=b.q, out=out, cu_seqlens_q=b.cu_seqlens_q, max_seqlen_q=b.max_q,
              seqused_k=b.seq_lens, max_seqlen_k=b.max_kv, softmax_scale=b.q.shape[-1] ** -0.5,
              causal=causal, window_size=window, block_table=b.block_table, softcap=0,
              q_descale=None)
    if int4 is None:
        ones = torch.ones((len(b.q_lens), b.key_cache.shape[2]), device=DEV)
        ua.unified_attention(k=b.key_cache, v=b.value_cache, k_descale=ones, v_descale=ones,
                             **kw)
    else:
        key, value, ks, vs = int4
        ua.unified_attention(k=key, v=value, k_descale=None, v_descale=None,
                             kv_quant_mode=mode.INT4_PER_TOKEN_HEAD, k_scale_cache=ks,
                             v_scale_cache=vs, **kw)
    return out


def _rows(b: Any, r: Any) -> Any:
    s = int(b.cu_seqlens_q[r])
    return slice(s, s + b.q_lens[r])


# (q lens, kv lens, causal flags, Hq, Hkv, D, window): draft blocks of a few tokens; the
# non-causal sequences are short, so the keys after a query weigh visibly
CASES = [
    ([8, 8, 4], [1500, 24, 12], [1, 0, 0], 16, 4, 128, (-1, -1)),
    ([16, 6], [48, 3000], [0, 1], 32, 4, 128, (-1, -1)),
    ([8, 8], [32, 700], [0, 1], 16, 2, 256, (-1, -1)),
]


def test_windowed_non_causal_refused(mods: Any) -> None:
    """Until a GPU comparison backs it, a sliding window with non-causal rows is refused."""
    ua, i4, mode = mods
    gen = torch.Generator(device=DEV).manual_seed(5)
    b = make_batch([8, 8], [400, 40], 16, 4, 128, 16, torch.bfloat16, gen)
    causal = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    with pytest.raises(NotImplementedError, match="without a sliding window"):
        _attn(ua, mode, b, causal, (15, 0), int4=int4_cache(i4, b))


@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_per_sequence_causal_against_core(mods: Any, case: Any) -> None:
    ua, i4, mode = mods
    q_lens, kv_lens, flags, hq, hkv, d, window = case
    gen = torch.Generator(device=DEV).manual_seed(300 + len(LINES))
    b = make_batch(q_lens, kv_lens, hq, hkv, d, 16, torch.bfloat16, gen)
    causal = torch.tensor(flags, dtype=torch.int32, device=DEV)
    cache = int4_cache(i4, b)
    ref = _attn(ua, mode, b, causal, window)  # the core kernel, bf16 sources
    out = _attn(ua, mode, b, causal, window, int4=cache)
    assert not out.isnan().any()
    r = rel(out, ref)
    causal_run = _attn(ua, mode, b, True, window, int4=cache)
    r_int4 = rel(causal_run, _attn(ua, mode, b, True, window))  # int4's own error here
    assert r <= 1.25 * r_int4, (r, r_int4)
    diffs = []
    for i, f in enumerate(flags):
        rows = _rows(b, i)
        d_i = max_err(out[rows], causal_run[rows])
        diffs.append(d_i)
        if f:
            assert d_i <= 1e-2, (i, d_i)  # a causal sequence: as in the causal run
        else:
            assert d_i > 5e-2, (i, d_i)  # non-causal: the later keys change it
            # and the change is the core kernel's non-causal one
            assert rel(out[rows], ref[rows]) < rel(causal_run[rows], ref[rows])
    LINES.append(f"| {q_lens} | {kv_lens} | {flags} | {hq}/{hkv}/{d} | {window} | {r:.3f} "
                 f"(int4 causal: {r_int4:.3f}) | "
                 f"{', '.join(f'{x:.2e}' for x in diffs)} |")


def _pristine_outputs(cases: Any) -> list[Any]:
    vllm_tree.install(vllm_tree.pristine_root())
    try:
        ua, i4, mode = _load()
        return [_attn(ua, mode, b, True, w, int4=int4_cache(i4, b)) for b, w in cases]
    finally:
        vllm_tree.install()


def test_causal_bitwise_as_pristine(mods: Any) -> None:
    ua, i4, mode = mods
    gen = torch.Generator(device=DEV).manual_seed(77)
    cases = [(make_batch([8, 3], [3000, 500], 16, 4, 128, 16, torch.bfloat16, gen), (-1, -1)),
             (make_batch([8], [4000], 16, 4, 128, 16, torch.bfloat16, gen), (1023, 0)),
             (make_batch([1, 1], [9000, 77], 16, 4, 128, 16, torch.bfloat16, gen), (-1, -1))]
    ours = [_attn(ua, mode, b, True, w, int4=int4_cache(i4, b)) for b, w in cases]
    theirs = _pristine_outputs(cases)
    for o, t in zip(ours, theirs, strict=True):
        assert torch.equal(o, t)
    LINES.append(f"| causal=True, {len(cases)} batches (one windowed, one decode) | | | | | "
                 "bit-equal to pristine | |")


def test_zz_record() -> None:
    record("int4_kv_per_token_head", [
        "int4 per-token-head cache written by `reshape_and_cache_int4`; per-sequence causal "
        "through `unified_attention` vs the core kernel on the bf16 sources: rel of the "
        "batch; per sequence, max |int4 per-seq - int4 causal run| (large for flag 0, small "
        "for flag 1).", "",
        "| q lens | kv lens | causal flags | Hq/Hkv/D | window | rel vs core | per-seq diff "
        "vs causal run |", "|---|---|---|---|---|---|---|", *LINES])
