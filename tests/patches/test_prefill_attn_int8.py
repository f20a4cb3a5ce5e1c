"""prefill-attn-int8: FLASH_ATTN runs one request's causal prefill chunk of more than 16 query
tokens at head size 256 on a Triton kernel with an int8 (or bf16) Q.K^T, with
VLLM_PREFILL_ATTN=int8|fp16 (registered here, off by default).

Host half on vLLM's real Python: the gate (use_prefill_attn in v1/attention/ops/
prefill_attn_hd256.py, Triton stubbed) as a truth table, the knob in the tree's envs.py, and
FlashAttentionImpl.forward consulting the gate with the batch's causal flag before the
FlashAttention call, handing the kernel the host bound of kv_len. The kernels' numerics and
speed: tests/gpu/test_prefill_attn_int8_gpu.py."""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, load_envs, load_module, make_module
from .test_spec_decode_attn import _Triton

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

OPS = "v1/attention/ops/prefill_attn_hd256.py"
FLASH = "v1/attention/backends/flash_attn.py"


def _load(tree: Path) -> types.ModuleType:
    path = tree / OPS
    assert path.exists(), f"{OPS} is not in the tree"
    return load_module(path, {"vllm.triton_utils": make_module(
        "vllm.triton_utils", triton=_Triton(), tl=types.SimpleNamespace(constexpr=int))})


def _args(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        max_query_len=2048, num_reqs=1, num_heads=24, num_kv_heads=4, head_size=256,
        kv_cache_dtype=torch.bfloat16, kv_cache_quantized=False, causal=True,
        sliding_window=None, logits_soft_cap=None, alibi_slopes=None, sinks=None,
        has_mask=False)
    args.update(over)
    return args


def test_patched_gate_truth_table(patched_vllm: Path) -> None:
    gate = _load(patched_vllm).use_prefill_attn
    for mode in ("int8", "fp16"):
        assert gate(mode, **_args()) is True
    assert gate("", **_args()) is False                       # knob off
    assert gate("int4", **_args()) is False                   # not a mode
    assert gate("int8", **_args(max_query_len=16)) is False   # decode / verify shaped
    assert gate("int8", **_args(max_query_len=17)) is True
    assert gate("int8", **_args(num_reqs=2)) is False
    assert gate("int8", **_args(head_size=128)) is False
    for hq, hkv, ok in ((32, 4, True), (16, 2, True), (36, 4, False), (24, 5, False),
                        (8, 8, True)):
        assert gate("int8", **_args(num_heads=hq, num_kv_heads=hkv)) is ok, (hq, hkv)
    assert gate("int8", **_args(kv_cache_dtype=torch.float16)) is False
    assert gate("int8", **_args(kv_cache_quantized=True)) is False
    per_seq = torch.tensor([1], dtype=torch.int32)
    assert gate("int8", **_args(causal=per_seq)) is False     # never its truth value
    assert gate("int8", **_args(causal=False)) is False
    assert gate("int8", **_args(sliding_window=[-1, -1])) is True
    assert gate("int8", **_args(sliding_window=[1023, 0])) is False
    assert gate("int8", **_args(logits_soft_cap=30.0)) is False
    assert gate("int8", **_args(alibi_slopes=torch.ones(24))) is False
    assert gate("int8", **_args(sinks=torch.zeros(24))) is False
    assert gate("int8", **_args(has_mask=True)) is False


def _check_knob(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(tree)
    assert "VLLM_PREFILL_ATTN" in envs.environment_variables, "VLLM_PREFILL_ATTN not registered"
    monkeypatch.delenv("VLLM_PREFILL_ATTN", raising=False)
    assert envs.VLLM_PREFILL_ATTN == ""
    for mode in ("int8", "fp16"):
        monkeypatch.setenv("VLLM_PREFILL_ATTN", mode)
        got = envs.VLLM_PREFILL_ATTN
        assert got == mode
    monkeypatch.setenv("VLLM_PREFILL_ATTN", "int4")
    with pytest.raises(ValueError):
        _ = envs.VLLM_PREFILL_ATTN


def test_patched_knob(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_knob(patched_vllm, monkeypatch)


def test_pristine_lacks_knob(pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check_knob(pristine_vllm, monkeypatch))


def _check_forward(tree: Path) -> None:
    mod = ast.parse((tree / FLASH).read_text())
    impl = next(n for n in mod.body if isinstance(n, ast.ClassDef)
                and n.name == "FlashAttentionImpl")
    fwd = next(n for n in impl.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    calls = [n for n in ast.walk(fwd) if isinstance(n, ast.Call)]
    names = [ast.unparse(c.func) for c in calls]
    assert "prefill_attn_hd256.use_prefill_attn" in names, "forward never consults the gate"
    gate = calls[names.index("prefill_attn_hd256.use_prefill_attn")]
    kws = {k.arg: ast.unparse(k.value) for k in gate.keywords}
    assert kws["causal"] == "attn_metadata.causal"
    run = calls[names.index("prefill_attn_hd256.prefill_attention_hd256")]
    assert "attn_metadata.max_seq_len" in [ast.unparse(a) for a in run.args]
    # before the FlashAttention call, after the split-KV branch
    wanted = ("spec_decode_attn.spec_decode_attention", "prefill_attn_hd256.use_prefill_attn",
              "_FA4_DENSE_ATTENTION_KERNEL")
    order = [n for _, n in sorted((c.lineno, ast.unparse(c.func)) for c in calls
                                  if ast.unparse(c.func) in wanted)]
    assert order == list(wanted), order
    # no host sync in the gate's inputs
    assert not any(n.endswith(".item") for n in names)


def test_patched_forward_consults_gate(patched_vllm: Path) -> None:
    _check_forward(patched_vllm)


def test_pristine_forward_has_no_gate(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_forward(pristine_vllm))
