"""marlin-int8-asym-zp: the Marlin int8-activation path accepts zero-point uint4 weights
(asymmetric AWQ) in both places that used to assert uint4b8; fp8 activations and 8-bit
weights are still refused."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function, load_module

pytestmark = pytest.mark.e2e


class _Reached(Exception):
    """Raised by the first collaborator after the weight-type check: the check passed."""


def _reached(*args: Any, **kwargs: Any) -> Any:
    raise _Reached


INT8 = "torch.int8"
FP8 = "torch.float8_e4m3fn"
_torch = SimpleNamespace(int8=INT8, float8_e4m3fn=FP8, Tensor=object, dtype=object,
                         nn=SimpleNamespace(Module=object))


def _accepts_apply(tree: Path, st: Any, wtype: Any, act: str) -> bool:
    fn = exec_function(
        tree / "model_executor/layers/quantization/utils/marlin_utils.py",
        "apply_gptq_marlin_linear",
        {"torch": _torch, "scalar_types": st, "ScalarType": object,
         "USE_FP32_REDUCE_DEFAULT": True,
         "marlin_repacked_nk": lambda w, bits: (64, 64),
         "marlin_pad_dim": lambda x, size, padded: x,
         "should_use_atomic_add_reduce": lambda **kw: False,
         "marlin_quant_input": _reached},
    )
    x = SimpleNamespace(shape=(2, 64), device="cuda", dtype="bf16",
                        reshape=lambda *a: SimpleNamespace(size=lambda d: 2))
    try:
        fn(x, None, None, None, None, wtype, 64, 64, input_dtype=act)
    except _Reached:
        return True
    except AssertionError:
        return False
    raise AssertionError("unreachable")


def _accepts_kernel(tree: Path, st: Any, wtype: Any, act: str) -> bool:
    fn = exec_function(
        tree / "model_executor/kernels/linear/mixed_precision/marlin.py",
        "MarlinLinearKernel.process_weights_after_loading",
        {"torch": _torch, "scalar_types": st, "ops": SimpleNamespace(
            marlin_int4_fp8_preprocess=_reached), "marlin_padded_nk": _reached},
    )
    # act_type compares equal to the torch dtype stand-ins and has an itemsize of 1.
    config = SimpleNamespace(act_type=_Act(act), weight_type=wtype,
                             partition_weight_shape=(64, 64), group_size=128)
    layer = SimpleNamespace(w_q=SimpleNamespace(device="cuda"))
    self = SimpleNamespace(config=config, w_q_name="w_q", w_s_name="w_s", w_zp_name=None)
    try:
        fn(self, layer)
    except _Reached:
        return True
    except AssertionError:
        return False
    raise AssertionError("unreachable")


class _Act(str):
    itemsize = 1


def _check(tree: Path, scalar_type_mod: Any) -> None:
    st = scalar_type_mod.scalar_types
    for accepts in (_accepts_apply, _accepts_kernel):
        assert accepts(tree, st, st.uint4b8, INT8), accepts.__name__
        assert accepts(tree, st, st.uint4, INT8), f"{accepts.__name__} refuses int8 x uint4"
        assert not accepts(tree, st, st.uint8b128, INT8), accepts.__name__
        assert not accepts(tree, st, st.uint4, FP8), accepts.__name__


@pytest.fixture(scope="module")
def scalar_type_mod(patched_vllm: Path) -> Any:
    return load_module(patched_vllm / "scalar_type.py")


def test_patched_int8_accepts_zero_point_uint4(patched_vllm: Path, scalar_type_mod: Any) -> None:
    _check(patched_vllm, scalar_type_mod)


def test_pristine_refuses_zero_point_uint4(pristine_vllm: Path, scalar_type_mod: Any) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, scalar_type_mod))
