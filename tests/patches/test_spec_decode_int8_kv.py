"""spec-decode-int8-kv: the split-KV verify attention reads an INT8_PER_TOKEN_HEAD cache, and
TRITON_ATTN routes multi-query batches over such a cache to it.

Host half on vLLM's real Python: the cache-format predicate over the tree's own KVQuantMode,
the gate for the cases the Triton backend adds (a per-sequence causal tensor, a chunked mask,
fused output quantisation), and the backend's forward consulting the gate with the batch's
causal flag and handing the kernel the scale caches before its unified_attention call. The
kernel's numerics on the real cache layout: tests/gpu/test_spec_decode_int8_kv_gpu.py."""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, load_kv_cache_interface
from .test_spec_decode_attn import load_ops

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

TRITON = "v1/attention/backends/triton_attn.py"


@pytest.fixture
def sda(patched_vllm: Path) -> types.ModuleType:
    return load_ops(patched_vllm)


def test_patched_readable_cache_modes(sda: types.ModuleType, patched_vllm: Path) -> None:
    mode = load_kv_cache_interface(patched_vllm).KVQuantMode
    readable = sda.readable_kv_cache
    assert readable(mode.NONE, False) is True
    assert readable(mode.INT8_PER_TOKEN_HEAD, True) is True
    assert readable(mode.INT8_PER_TOKEN_HEAD, False) is False  # scale caches absent
    # same structure, untested: excluded
    assert readable(mode.FP8_PER_TOKEN_HEAD, True) is False
    assert readable(mode.FP8_PER_TOKEN_HEAD, False) is False
    assert readable(mode.INT4_PER_TOKEN_HEAD, True) is False
    assert readable(mode.NVFP4, True) is False


def _args(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        max_query_len=8, num_reqs=2, kv_cache_quantized=False, sliding_window=(-1, -1),
        logits_soft_cap=0, alibi_slopes=None, sinks=None, has_mask=False, causal=True,
        fused_output_quant=False,
    )
    args.update(over)
    return args


def test_patched_gate_triton_cases(sda: types.ModuleType) -> None:
    buf = sda.SpecDecodeAttnBuffers(2, 4, 8, 16, "cpu")
    gate = sda.use_spec_decode_attn
    assert gate(buf, **_args()) is True
    causal = torch.tensor([1, 0], dtype=torch.int32)
    with pytest.raises(RuntimeError):
        bool(torch.tensor([1, 1]))  # why the gate never takes a tensor's truth value
    assert gate(buf, **_args(causal=causal)) is False
    assert gate(buf, **_args(fused_output_quant=True)) is False
    assert gate(buf, **_args(has_mask=True)) is False  # chunked / mm prefix / R-SWA
    assert gate(buf, **_args(kv_cache_quantized=True)) is False


def _forward(tree: Path) -> tuple[ast.FunctionDef, ast.FunctionDef]:
    mod = ast.parse((tree / TRITON).read_text())
    impl = next(n for n in mod.body if isinstance(n, ast.ClassDef)
                and n.name == "TritonAttentionImpl")
    fns = {n.name: n for n in impl.body if isinstance(n, ast.FunctionDef)}
    return fns["forward"], fns["__init__"]


def _check_forward(tree: Path) -> None:
    fwd, init = _forward(tree)
    calls = [n for n in ast.walk(fwd) if isinstance(n, ast.Call)]
    names = [ast.unparse(c.func) for c in calls]
    assert "spec_decode_attn.use_spec_decode_attn" in names, "TRITON_ATTN has no gate"
    gate = calls[names.index("spec_decode_attn.use_spec_decode_attn")]
    kw = {k.arg: ast.unparse(k.value) for k in gate.keywords}
    assert kw["causal"] == "attn_metadata.causal"
    assert "readable_kv_cache" in kw["kv_cache_quantized"]
    assert "self.chunk_lookback != -1" in kw["has_mask"]
    assert kw["fused_output_quant"] == "output_scale is not None"
    run = calls[names.index("spec_decode_attn.spec_decode_attention")]
    run_kw = {k.arg: ast.unparse(k.value) for k in run.keywords}
    assert run_kw["k_scale_cache"] == "k_scale_cache"
    assert run_kw["v_scale_cache"] == "v_scale_cache"
    assert gate.lineno < run.lineno < calls[names.index("unified_attention")].lineno
    init_src = ast.unparse(init)
    assert "KVQuantMode.INT8_PER_TOKEN_HEAD" in init_src
    assert "buffers_for_config" in init_src


def test_patched_triton_forward_routes(patched_vllm: Path) -> None:
    _check_forward(patched_vllm)


def test_pristine_triton_forward_lacks_route(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_forward(pristine_vllm))
