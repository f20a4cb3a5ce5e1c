"""int4-kv-per-token-head: TRITON_ATTN's unified_attention hands an INT4_PER_TOKEN_HEAD batch
with a per-sequence causal tensor (the DFlash2 drafter's) to the packed int4 kernel, with the
causal flags, instead of asserting "causal only"; the packed launchers take and pass them; a
non-causal batch with a sliding window is refused with NotImplementedError.

Runs vLLM's real unified_attention (v1/attention/ops/triton_unified_attention.py, Triton
stubbed) with unified_attention_int4 replaced by a recorder, and reads the launchers'
signatures from the real int4_per_token_head.py. The kernel's numerics (per-sequence causal
against the core kernel, causal bit-equal to the pristine kernel): tests/gpu/
test_int4_kv_per_token_head_gpu.py."""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any

import pytest

from ._helpers import (
    assert_pristine_lacks,
    load_kv_cache_interface,
    load_with_auto_stubs,
    make_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

UA = "v1/attention/ops/triton_unified_attention.py"
INT4 = "v1/attention/ops/int4_per_token_head.py"


def _call(tree: Path, causal: Any, window: tuple[int, int] = (-1, -1)) -> dict[str, Any]:
    kvi = load_kv_cache_interface(tree)
    envs = make_module("vllm.envs", VLLM_BATCH_INVARIANT=False)
    platform = types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn,
                                     is_rocm=lambda: False, is_cuda=lambda: True)
    mod = load_with_auto_stubs(tree / UA, {
        "vllm.v1.kv_cache_interface": kvi, "vllm.envs": envs,
        "vllm.platforms": make_module("vllm.platforms", current_platform=platform),
    }, loose=True)
    seen: dict[str, Any] = {}

    def recorder(**kw: Any) -> None:
        seen.update(kw)

    int4 = make_module("vllm.v1.attention.ops.int4_per_token_head",
                       unified_attention_int4=recorder)
    q = torch.zeros((4, 2, 8))
    with stub_modules({"vllm.v1.attention.ops.int4_per_token_head": int4}):
        mod.unified_attention(
            q=q, k=None, v=None, out=torch.empty_like(q),
            cu_seqlens_q=torch.tensor([0, 2, 4], dtype=torch.int32), max_seqlen_q=2,
            seqused_k=torch.tensor([5, 7], dtype=torch.int32), max_seqlen_k=7,
            softmax_scale=0.3, causal=causal, window_size=window, block_table=None,
            softcap=0, q_descale=None, k_descale=None, v_descale=None,
            kv_quant_mode=kvi.KVQuantMode.INT4_PER_TOKEN_HEAD,
            k_scale_cache=torch.zeros(1), v_scale_cache=torch.zeros(1))
    return seen


def _check_per_seq(tree: Path) -> None:
    flags = torch.tensor([1, 0], dtype=torch.int32)
    seen = _call(tree, flags)
    assert seen, "unified_attention_int4 was not called"
    assert seen["use_causal"] is True
    assert seen["per_seq_causal_ptr"] is flags
    seen = _call(tree, False)
    assert seen["use_causal"] is False and seen["per_seq_causal_ptr"] is None


def test_patched_per_seq_causal_reaches_int4(patched_vllm: Path) -> None:
    _check_per_seq(patched_vllm)
    seen = _call(patched_vllm, True)  # the default: causal, no tensor
    assert seen["use_causal"] is True and seen["per_seq_causal_ptr"] is None
    # a window stays causal-only: untested non-causal windows are refused, clearly
    seen = _call(patched_vllm, True, window=(127, 0))
    assert seen["window_size"] == (127, 0)
    flags = torch.tensor([1, 0], dtype=torch.int32)
    for causal in (flags, False):
        with pytest.raises(NotImplementedError, match="without a sliding window"):
            _call(patched_vllm, causal, window=(127, 0))


def test_pristine_asserts_causal_only(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_per_seq(pristine_vllm))


def _defaults(tree: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for node in ast.parse((tree / INT4).read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name in (
                "_attn_packed", "_launch_packed_attn", "unified_attention_int4"):
            a = node.args
            pos = a.args[len(a.args) - len(a.defaults):]
            pairs = list(zip(pos, a.defaults, strict=True))
            pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d]
            out[node.name] = {arg.arg: ast.unparse(d) for arg, d in pairs}
    return out


def test_patched_launchers_default_to_causal(patched_vllm: Path) -> None:
    d = _defaults(patched_vllm)
    assert d["_attn_packed"]["USE_CAUSAL"] == "True"
    assert d["_attn_packed"]["USE_PER_SEQ_CAUSAL"] == "False"
    assert d["_attn_packed"]["per_seq_causal_ptr"] == "None"
    for fn in ("_launch_packed_attn", "unified_attention_int4"):
        assert d[fn]["use_causal"] == "True" and d[fn]["per_seq_causal_ptr"] == "None", fn
    src = (patched_vllm / INT4).read_text()
    # the flags reach both shared helpers: the KV mask and the tile-loop bounds
    tree = ast.parse(src)
    for helper in ("compute_kv_seq_mask", "compute_tile_loop_bounds"):
        call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and ast.unparse(n.func) == helper)
        kws = {k.arg for k in call.keywords}
        assert {"USE_CAUSAL", "USE_PER_SEQ_CAUSAL"} <= kws, helper
