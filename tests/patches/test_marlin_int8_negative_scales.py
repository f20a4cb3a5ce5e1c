"""marlin-int8-negative-scales: before Marlin's int8-activation path requantises the group
scales (read as uint16 by the kernel), every negative group is folded into its codes: s -> -s,
code v -> min(16 - v, 15). The dense kernel's ``process_weights_after_loading`` hands the folded
tensors to the repack and the scale permutation; the MoE oracle folds every expert alike.

Runs vLLM's own helper, requantiser and padding functions (quantization/utils/marlin_utils.py)
and ``MarlinLinearKernel.process_weights_after_loading`` with the compiled ops replaced by
recorders. The helper on CUDA: tests/gpu/test_marlin_int8_negative_scales_gpu.py; the W4A8 GEMM
itself needs vLLM's compiled ops (not run here)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function, load_envs, load_module

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

UTILS = "model_executor/layers/quantization/utils/marlin_utils.py"
KERNEL = "model_executor/kernels/linear/mixed_precision/marlin.py"
MOE = "model_executor/layers/fused_moe/oracle/int_wna16.py"
FOLD = "marlin_fold_negative_group_scales"


def _utils(tree: Path) -> dict[str, Any]:
    """The real marlin_utils functions the tests and the kernel use."""
    math_utils = load_module(tree / "utils/math_utils.py")
    ns: dict[str, Any] = {"torch": torch, "math": math, "round_up": math_utils.round_up,
                          "logger": SimpleNamespace(warning_once=lambda *a: None)}
    names = ["marlin_act_int8_process_scales", "marlin_padded_nk", "marlin_pad_qweight",
             "marlin_pad_scales", "marlin_pad_dim"]
    source = (tree / UTILS).read_text()
    if f"def {FOLD}(" in source:
        names.append(FOLD)
    found = {name: exec_function(tree / UTILS, name, ns) for name in names}

    def missing(*args: Any) -> Any:
        raise AssertionError(f"{FOLD} is not in {UTILS}")

    found.setdefault(FOLD, missing)
    return found


def _pack(codes: Any) -> Any:
    """[K, N] codes 0..15 -> [K/8, N] int32, nibble i of row r = K index 8r+i."""
    k, n = codes.shape
    c = codes.to(torch.int64).reshape(k // 8, 8, n)
    words = sum(c[:, i, :] << (4 * i) for i in range(8))
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _unpack(words: Any) -> Any:
    w = words.to(torch.int64)
    return torch.stack([(w >> (4 * i)) & 0xF for i in range(8)], dim=1).reshape(
        -1, words.shape[1])


def _layer(k: int = 512, n: int = 192, g: int = 128, seed: int = 0,
           negative: float = 0.5) -> tuple[Any, Any, Any]:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (k, n), generator=gen)
    codes[0, :] = 0  # every column has a q = -8 element
    scales = torch.rand((k // g, n), generator=gen) * 0.02 + 1e-3
    flip = torch.rand((k // g, n), generator=gen) < negative
    scales = torch.where(flip, -scales, scales).to(torch.float16)
    return codes, _pack(codes), scales


def _dequant(codes: Any, scales: Any, g: int) -> Any:
    return (codes.double() - 8) * scales.double().repeat_interleave(g, dim=0)


def _check_fold(tree: Path) -> None:
    fold = _utils(tree)[FOLD]
    g = 128
    codes, packed, scales = _layer(g=g)
    q2, s2 = fold(packed, scales, g)
    assert q2.dtype == torch.int32 and q2.shape == packed.shape
    assert bool((s2 >= 0).all())
    before, after = _dequant(codes, scales, g), _dequant(_unpack(q2), s2, g)
    flipped = (scales < 0).repeat_interleave(g, dim=0)
    saturated = flipped & (codes == 0)
    changed = before != after
    assert int(saturated.sum()) > 0
    assert torch.equal(changed, saturated)
    # the saturated q = -8 element becomes +7: exactly |s| away
    step = scales.double().abs().repeat_interleave(g, dim=0)
    assert torch.equal((after - before)[saturated].abs(), step[saturated])
    # all-negative layer: folded first, the requantiser's global scale is positive
    _, packed_all, scales_all = _layer(negative=1.0, seed=3)
    assert bool((fold(packed_all, scales_all, g)[1] > 0).all())
    # experts: a leading dim is folded alike
    stacked = fold(torch.stack([packed, packed]), torch.stack([scales, scales]), g)
    assert torch.equal(stacked[0][1], q2) and torch.equal(stacked[1][0], s2)


def _uint16(s: Any, requant: Any) -> tuple[Any, Any]:
    r, _ = requant(s)
    signed = r.view(torch.int16).to(torch.int32)
    return signed, signed & 0xFFFF


def _check_uint16_read(tree: Path) -> None:
    u = _utils(tree)
    _, packed, scales = _layer()
    signed, unsigned = _uint16(u[FOLD](packed, scales, 128)[1],
                               u["marlin_act_int8_process_scales"])
    assert torch.equal(signed, unsigned)
    assert int(signed.min()) >= 0 and int(signed.max()) <= 4096


def test_patched_fold_changes_only_saturated_elements(patched_vllm: Path) -> None:
    _check_fold(patched_vllm)


def test_patched_requantised_scales_read_unsigned(patched_vllm: Path) -> None:
    _check_uint16_read(patched_vllm)


def test_patched_no_negative_scale_is_untouched(patched_vllm: Path) -> None:
    fold = _utils(patched_vllm)[FOLD]
    _, packed, scales = _layer(negative=0.0)
    q2, s2 = fold(packed, scales, 128)
    assert q2 is packed and s2 is scales


# --- the dense kernel's process_weights_after_loading -------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.repacked: list[Any] = []
        self.scales: list[Any] = []

    def ops(self) -> Any:
        def repack(q: Any, **kw: Any) -> Any:
            self.repacked.append(q.clone())
            return q
        return SimpleNamespace(gptq_marlin_repack=repack,
                               marlin_int4_fp8_preprocess=lambda *a, **k: None)

    def permute_scales(self, s: Any, **kw: Any) -> Any:
        self.scales.append(s.clone())
        return s


class _Act:
    """Compares equal to one torch dtype and has its itemsize."""

    def __init__(self, dtype: Any) -> None:
        self.dtype, self.itemsize = dtype, dtype.itemsize

    def __eq__(self, other: object) -> bool:
        return bool(other == self.dtype)

    __hash__ = None  # type: ignore[assignment]


def _load(tree: Path, act: Any, *, group_size: int = 128, zero_points: bool = False,
          k: int = 512, n: int = 192) -> tuple[_Recorder, Any, Any]:
    """(recorder, codes handed in, scales handed in) after one real
    process_weights_after_loading."""
    st = load_module(tree / "scalar_type.py").scalar_types
    rec = _Recorder()
    u = _utils(tree)
    namespace = {**u, "torch": torch, "scalar_types": st, "ops": rec.ops(),
                 "envs": load_envs(tree),
                 "permute_param_layout_": lambda x, **kw: None,
                 "BasevLLMParameter": torch.nn.Parameter,
                 "marlin_permute_scales": rec.permute_scales,
                 "marlin_make_empty": lambda device: torch.empty(0, dtype=torch.int),
                 "marlin_permute_bias": lambda b: b, "logger": logging.getLogger("t")}
    run = exec_function(tree / KERNEL, "MarlinLinearKernel.process_weights_after_loading",
                        namespace)
    _, packed, scales = _layer(k=k, n=n, g=group_size if group_size > 0 else k)
    layer = torch.nn.Module()
    layer.w_q = torch.nn.Parameter(packed.clone(), requires_grad=False)
    layer.w_s = torch.nn.Parameter(scales.clone(), requires_grad=False)
    config = SimpleNamespace(act_type=act, weight_type=st.uint4 if zero_points else st.uint4b8,
                             partition_weight_shape=(k, n), group_size=group_size,
                             zero_points=zero_points)
    kernel = SimpleNamespace(
        config=config, w_q_name="w_q", w_s_name="w_s", w_zp_name="w_zp" if zero_points else None,
        _transform_param=lambda layer, name, fn: fn(getattr(layer, name)))
    if zero_points:
        layer.w_zp = torch.nn.Parameter(torch.zeros((k // group_size, n // 8),
                                                    dtype=torch.int32), requires_grad=False)
        namespace.update(unpack_cols=lambda *a: torch.zeros(k // group_size, n),
                         marlin_zero_points=lambda x, **kw: x)
        run = exec_function(tree / KERNEL,
                            "MarlinLinearKernel.process_weights_after_loading", namespace)
    run(kernel, layer)
    return rec, packed, scales


def _check_kernel(tree: Path) -> None:
    fold = _utils(tree)[FOLD]
    for n in (192, 100):  # unpadded, and padded (N 100 -> 128)
        rec, packed, scales = _load(tree, _Act(torch.int8), n=n)
        q2, s2 = fold(packed, scales, 128)
        (repacked,) = rec.repacked
        (permuted,) = rec.scales
        assert torch.equal(repacked[:, :n], q2) and not bool(repacked[:, n:].any())
        assert torch.equal(permuted[:, :n], s2) and not bool(permuted[:, n:].any())


def test_patched_kernel_repacks_the_folded_tensors(patched_vllm: Path) -> None:
    _check_kernel(patched_vllm)


def test_patched_kernel_leaves_other_paths_alone(patched_vllm: Path) -> None:
    cases: list[dict[str, Any]] = [dict(act=_Act(torch.float8_e4m3fn)),             # fp8 activations
             dict(act=_Act(torch.int8), group_size=-1),       # channelwise
             dict(act=_Act(torch.int8), group_size=512),      # one group
             dict(act=_Act(torch.int8), zero_points=True)]    # asymmetric
    for case in cases:
        rec, packed, scales = _load(patched_vllm, **case)
        assert torch.equal(rec.repacked[0], packed), case
        if case["act"].dtype == torch.int8:
            assert torch.equal(rec.scales[0], scales), case


def _moe(tree: Path) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """One real _process_weights_marlin (int8 activations, 2 experts, hidden 256,
    intermediate 256, group 128): what it hands the repack and the scale permutation, and
    the canonical [E, N, K/pack] inputs."""
    u = _utils(tree)
    repacked: list[Any] = []
    permuted: list[Any] = []

    def repack(q: Any, *a: Any, **k: Any) -> Any:
        repacked.append(q.clone())
        return q

    def permute(s: Any, **k: Any) -> Any:
        permuted.append(s.clone())
        return s

    namespace = {**u, "torch": torch,
                 "ops": SimpleNamespace(gptq_marlin_moe_repack=repack),
                 "marlin_moe_permute_scales": permute,
                 "marlin_moe_padded_intermediate": lambda n, g: n,
                 "marlin_permute_bias": lambda b: b}
    run = exec_function(tree / MOE, "_process_weights_marlin", namespace)
    hidden = inter = 256
    g = 128
    inputs: dict[str, Any] = {}
    for name, (n, k, seed) in {"w13": (2 * inter, hidden, 1), "w2": (hidden, inter, 2)}.items():
        qs, ss = [], []
        for e in range(2):
            _, q, sc = _layer(k=k, n=n, g=g, seed=seed * 10 + e)
            qs.append(q.t())   # canonical N-first
            ss.append(sc.t())
        inputs[f"{name}_qweight"] = torch.stack(qs)
        inputs[f"{name}_scales"] = torch.stack(ss)
    layer = SimpleNamespace(intermediate_size_per_partition=inter,
                            num_groups_w13=hidden // g, num_groups_w2=inter // g)
    run(layer, torch.int8, 4, 8, g, **inputs)
    return repacked, permuted, inputs


def _check_moe(tree: Path) -> None:
    fold = _utils(tree)[FOLD]
    repacked, permuted, inputs = _moe(tree)
    for i, name in enumerate(("w13", "w2")):
        q = inputs[f"{name}_qweight"].transpose(1, 2).contiguous()
        s = inputs[f"{name}_scales"].transpose(1, 2).contiguous()
        assert bool((s < 0).any())
        q2, s2 = fold(q, s, 128)
        assert torch.equal(repacked[i], q2), name
        assert torch.equal(permuted[i], s2), name


def test_patched_moe_oracle_folds_every_expert(patched_vllm: Path) -> None:
    _check_moe(patched_vllm)


def test_pristine_reads_negative_scales_as_large_unsigned(pristine_vllm: Path) -> None:
    requant = _utils(pristine_vllm)["marlin_act_int8_process_scales"]
    _, _, scales = _layer()
    _, unsigned = _uint16(scales, requant)
    assert int(unsigned.max()) >= 32768  # a negative scale read as 65536 + s
    assert_pristine_lacks(lambda: _check_uint16_read(pristine_vllm))
    assert_pristine_lacks(lambda: _check_kernel(pristine_vllm))
    repacked, _, inputs = _moe(pristine_vllm)
    assert torch.equal(repacked[0], inputs["w13_qweight"].transpose(1, 2))
