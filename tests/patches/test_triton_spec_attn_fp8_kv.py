"""triton-spec-attn-fp8-kv: the split-KV verify attention reads the per-tensor fp8 (e4m3) KV
cache under TRITON_ATTN, and VLLM_SPEC_ATTN_DEBUG is a registered, runtime-only knob.

Host half on vLLM's real Python: the cache-format predicate over the tree's own KVQuantMode
(e4m3 read, e5m2 refused), the knob's registration and its absence from the torch.compile
key (envs.compile_factors()), while the split-KV switch itself stays in the key, and the
backend handing the kernel the query/K/V descales. Numerics: tests/gpu/
test_triton_spec_attn_fp8_kv_gpu.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ._helpers import assert_pristine_lacks, envs_stubs_active, load_envs, load_kv_cache_interface
from .test_spec_decode_attn import load_ops

pytestmark = pytest.mark.e2e
pytest.importorskip("torch")

TRITON = "v1/attention/backends/triton_attn.py"


def test_patched_fp8_cache_modes(patched_vllm: Path) -> None:
    sda = load_ops(patched_vllm)
    mode = load_kv_cache_interface(patched_vllm).KVQuantMode
    readable = sda.readable_kv_cache
    assert readable(mode.FP8_PER_TENSOR, False, True) is True  # e4m3 cache
    assert readable(mode.FP8_PER_TENSOR, False, False) is False  # e5m2 (or not viewed as e4m3)
    assert readable(mode.FP8_PER_TENSOR, True, False) is False
    # the other modes are unchanged by the fp8 flag
    assert readable(mode.NONE, False, False) is True
    assert readable(mode.INT8_PER_TOKEN_HEAD, True, False) is True
    assert readable(mode.FP8_PER_TOKEN_HEAD, True, True) is False
    assert readable(mode.INT4_PER_TOKEN_HEAD, True, True) is False


def _check_knob(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(tree)
    assert "VLLM_SPEC_ATTN_DEBUG" in envs.environment_variables
    monkeypatch.delenv("VLLM_SPEC_ATTN_DEBUG", raising=False)
    assert envs.VLLM_SPEC_ATTN_DEBUG is False
    monkeypatch.setenv("VLLM_SPEC_ATTN_DEBUG", "1")
    assert envs.VLLM_SPEC_ATTN_DEBUG is True
    monkeypatch.delenv("VLLM_SPEC_ATTN_DEBUG")
    with envs_stubs_active(envs):
        base = envs.compile_factors()
        assert "VLLM_SPEC_ATTN_DEBUG" not in base
        monkeypatch.setenv("VLLM_SPEC_ATTN_DEBUG", "1")
        assert envs.compile_factors() == base, "the debug knob changes the compile key"
        monkeypatch.delenv("VLLM_SPEC_ATTN_DEBUG")
        # the kernel switch selects kernels: it stays in the key
        monkeypatch.setenv("VLLM_SPEC_DECODE_ATTN", "1")
        assert envs.compile_factors() != base
        monkeypatch.delenv("VLLM_SPEC_DECODE_ATTN")


def test_patched_debug_knob_runtime_only(patched_vllm: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _check_knob(patched_vllm, monkeypatch)


def _check_backend(tree: Path) -> None:
    mod = ast.parse((tree / TRITON).read_text())
    impl = next(n for n in mod.body if isinstance(n, ast.ClassDef)
                and n.name == "TritonAttentionImpl")
    fns = {n.name: n for n in impl.body if isinstance(n, ast.FunctionDef)}
    init_src = ast.unparse(fns["__init__"])
    assert "kv_cache_dtype in ('fp8', 'fp8_e4m3')" in init_src, "e5m2 not refused"
    calls = [n for n in ast.walk(fns["forward"]) if isinstance(n, ast.Call)]
    names = [ast.unparse(c.func) for c in calls]
    gate = calls[names.index("spec_decode_attn.use_spec_decode_attn")]
    kw = {k.arg: ast.unparse(k.value) for k in gate.keywords}
    assert "key_cache.dtype == self.fp8_dtype" in kw["kv_cache_quantized"]
    run = calls[names.index("spec_decode_attn.spec_decode_attention")]
    run_kw = {k.arg: ast.unparse(k.value) for k in run.keywords}
    for name in ("q_descale", "k_descale", "v_descale"):
        assert run_kw.get(name) == name, name


def test_patched_backend_passes_descales(patched_vllm: Path) -> None:
    _check_backend(patched_vllm)


def test_pristine_lacks_fp8_route(pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check_backend(pristine_vllm))
    assert_pristine_lacks(lambda: _check_knob(pristine_vllm, monkeypatch))
