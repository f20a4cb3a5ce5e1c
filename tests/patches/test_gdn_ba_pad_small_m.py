"""gdn-ba-pad-small-m: ``in_proj_ba``'s 2..pad_rows-1 row GEMMs are zero-padded to
ceil(2**21 / (N * K)) rows inside an opaque op (``vllm::gdn_ba_linear_small_m``), on
sm86/sm89/sm120 for an unquantised bf16 projection with K >= 4096 and the knob on.

Runs vLLM's own functions from model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py (the
padding rule, the op body and its fake, the layer's gate ``_ba_pad_rows`` and ``forward_cuda``'s
dispatch), extracted from the file, on CPU torch. Numerics and timing on a GPU:
tests/gpu/test_gdn_ba_pad_small_m_gpu.py."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function, load_envs

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

FILE = "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
CLS = "QwenGatedDeltaNetAttention"


def _constants(tree: Path) -> dict[str, Any]:
    """The module-level ``_BA_PAD_*`` constants of the file."""
    out: dict[str, Any] = {}
    for node in ast.parse((tree / FILE).read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.startswith("_BA_PAD_"):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def _fn(tree: Path, name: str, namespace: dict[str, Any] | None = None) -> Any:
    return exec_function(tree / FILE, name, {"torch": torch, **(namespace or {})})


class _Linear:
    """torch.nn.functional with ``linear`` recording the rows it multiplies."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.pad = torch.nn.functional.pad

    def linear(self, x: Any, w: Any) -> Any:
        self.rows.append(x.shape[0])
        return torch.nn.functional.linear(x, w)


def _check_op(tree: Path) -> None:
    rule = _fn(tree, "gdn_ba_pad_rows")
    assert [rule(96, 5120), rule(48, 5120), rule(96, 4096), rule(32, 4096)] == [5, 9, 6, 16]
    spy = _Linear()
    fake_torch = SimpleNamespace(nn=SimpleNamespace(functional=spy))
    op = exec_function(tree / FILE, "gdn_ba_linear_small_m", {"torch": fake_torch})
    fake = _fn(tree, "gdn_ba_linear_small_m_fake")
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 5120, generator=gen)
    for m in range(1, 9):
        x = torch.randn(m, 5120, generator=gen)
        out = op(x, w, 5)
        assert spy.rows[-1] == (5 if 2 <= m < 5 else m), (m, spy.rows)
        assert out.shape == (m, 96) == fake(x, w, 5).shape
        # padding changes only the blocking of the product (fp32, K 5120)
        torch.testing.assert_close(out, torch.nn.functional.linear(x, w), rtol=1e-4, atol=1e-3)


def test_patched_pad_rule_op_and_fake(patched_vllm: Path) -> None:
    _check_op(patched_vllm)


class _Unquantized:
    pass


def _gate(tree: Path, *, capability: tuple[int, int] | None = (8, 6), knob: str = "1",
          dtype: Any = None, quantized: bool = False, k: int = 5120, n: int = 96,
          bias: bool = False, cuda: bool = True, monkeypatch: Any) -> int:
    monkeypatch.setenv("VLLM_GDN_BA_PAD_SMALL_M", knob)
    envs = load_envs(tree)
    platform = SimpleNamespace(is_cuda=lambda: cuda, get_device_capability=lambda: capability)
    gate = _fn(tree, f"{CLS}._ba_pad_rows", {
        "envs": envs, "current_platform": platform, "UnquantizedLinearMethod": _Unquantized,
        "gdn_ba_pad_rows": _fn(tree, "gdn_ba_pad_rows"), **_constants(tree)})
    layer = SimpleNamespace(
        quant_method=object() if quantized else _Unquantized(),
        weight=torch.empty(n, k, dtype=dtype or torch.bfloat16),
        bias=torch.empty(n) if bias else None)
    return int(gate(SimpleNamespace(in_proj_ba=layer)))


def test_patched_gate(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def gate(**kw: Any) -> int:
        return _gate(patched_vllm, monkeypatch=monkeypatch, **kw)

    assert gate() == 5
    assert gate(capability=(8, 9)) == 5 and gate(capability=(12, 0)) == 5
    assert gate(n=48) == 9  # TP 2
    # off: sm90 (no cliff), sm80, ROCm/other, knob off, fp16, quantised, bias, small K
    assert gate(capability=(9, 0)) == 0 and gate(capability=(8, 0)) == 0
    assert gate(cuda=False) == 0 and gate(knob="0") == 0
    assert gate(dtype=torch.float16) == 0 and gate(quantized=True) == 0
    assert gate(bias=True) == 0 and gate(k=2048) == 0
    assert gate(capability=None) == 0


class _Stop(Exception):
    pass


def _dispatch(tree: Path, pad_rows: int, wrapped: bool) -> list[str]:
    calls: list[str] = []

    class MergedColumnParallelLinear:
        weight = "w"

        def __call__(self, x: Any) -> Any:
            calls.append("stock")
            return x, None

    class LoRAWrapper(MergedColumnParallelLinear):
        pass

    def op(x: Any, w: Any, rows: int) -> Any:
        calls.append(f"op:{rows}")
        return x

    fake_torch = SimpleNamespace(ops=SimpleNamespace(vllm=SimpleNamespace(
        gdn_ba_linear_small_m=op)), bfloat16=torch.bfloat16)
    forward = exec_function(tree / FILE, f"{CLS}.forward_cuda", {
        "torch": fake_torch, "MergedColumnParallelLinear": MergedColumnParallelLinear})

    class Layer:
        in_proj_qkvz = staticmethod(lambda x: (x, None))
        in_proj_ba = LoRAWrapper() if wrapped else MergedColumnParallelLinear()
        ba_pad_rows = pad_rows

        @property
        def enable_fused_gdn_spec_decode(self) -> bool:
            raise _Stop  # past the projections

    with pytest.raises(_Stop):
        forward(Layer(), torch.zeros(3, 8))
    return calls


def test_patched_forward_dispatch(patched_vllm: Path) -> None:
    assert _dispatch(patched_vllm, 5, wrapped=False) == ["op:5"]
    assert _dispatch(patched_vllm, 0, wrapped=False) == ["stock"]
    assert _dispatch(patched_vllm, 5, wrapped=True) == ["stock"]


def test_pristine_has_no_padding(pristine_vllm: Path) -> None:
    assert _dispatch(pristine_vllm, 5, wrapped=False) == ["stock"]
    assert_pristine_lacks(lambda: _check_op(pristine_vllm))
