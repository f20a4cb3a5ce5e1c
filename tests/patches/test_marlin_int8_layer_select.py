"""marlin-int8-layer-select: VLLM_MARLIN_INPUT_DTYPE_LAYERS and
VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS pick which Marlin layers run with the 8-bit input
dtype (W4A8); the rest keep 16-bit activations. Runs vLLM's own get_marlin_input_dtype
(marlin_utils.py, on CPU torch) with the knobs read through vLLM's own envs.py.

The MoE path: the experts kernel (vLLM's MarlinExperts, built from vLLM's FusedMoEConfig)
must choose the dtype the quant method chose when it repacked the experts' weights (GPTQ
and AWQ ask with the layer's prefix), for every knob setting; the fp8 MoE repack asks by
the same name."""

from __future__ import annotations

import ast
import dataclasses
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    LooseAutoStub,
    assert_pristine_lacks,
    exec_function,
    load_envs,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

LAYERS = [
    "model.embed_tokens",
    "model.layers.0.self_attn.qkv_proj",
    "model.layers.0.mlp.gate_up_proj",
    "model.layers.0.mlp.down_proj",
    "model.layers.47.mlp.down_proj",
    "lm_head",
]


class _Utils:
    """get_marlin_input_dtype and the helpers it calls, executed from marlin_utils.py
    (the module itself imports the GPU kernels' registrations)."""

    def __init__(self, tree: Path) -> None:
        path = tree / "model_executor/layers/quantization/utils/marlin_utils.py"
        ns: dict[str, Any] = {"envs": load_envs(tree), "torch": torch, "re": re,
                              "logger": logging.getLogger("test.marlin"),
                              "current_platform": None, "get__quant_fp8_method": None}
        for helper in ("_layer_patterns", "marlin_input_dtype_selects"):
            if f"def {helper}(" in path.read_text():
                ns[helper] = exec_function(path, helper, ns)
        self.get_marlin_input_dtype = exec_function(path, "get_marlin_input_dtype", ns)


def _marlin_utils(tree: Path) -> Any:
    return _Utils(tree)


MOE_LAYER = "model.layers.3.mlp.experts"
MOE = "model_executor/layers/fused_moe"


def _moe_config(tree: Path, layer_name: str) -> Any:
    """vLLM's FusedMoEConfig for a MoE layer, built as fused_moe/layer.py builds it (the
    ROCm AITER probe of __post_init__ stands in)."""
    config = load_with_auto_stubs(tree / f"{MOE}/config.py",
                                  {"vllm.logger": once_logger_module()}, loose=True)
    aiter = make_module("vllm._aiter_ops", rocm_aiter_ops=SimpleNamespace(
        is_fused_moe_enabled=lambda: False,
        is_fusion_moe_shared_experts_enabled=lambda: False))
    # A config without the field (the patch before the fix) is built without the name, so
    # the check below reports the disagreement itself rather than a TypeError.
    named = ({"layer_name": layer_name}
             if "layer_name" in {f.name for f in dataclasses.fields(config.FusedMoEConfig)}
             else {})
    with stub_modules({"vllm._aiter_ops": aiter}):
        return config.FusedMoEConfig(
            num_experts=8, experts_per_token=2, hidden_dim=256, intermediate_size=512,
            num_local_experts=8, num_logical_experts=8,
            activation=SimpleNamespace(is_gated=True), device="cpu", routing_method=None,
            moe_parallel_config=config.FusedMoEParallelConfig.make_no_parallel(),
            in_dtype=torch.bfloat16, max_num_tokens=256, **named)


def _moe_dtypes(tree: Path, monkeypatch: pytest.MonkeyPatch,
                **knobs: str) -> tuple[Any, Any]:
    """(the dtype the quant method repacks the experts for, the dtype vLLM's MarlinExperts
    runs them with) for the MoE layer MOE_LAYER of a W4A16 checkpoint."""
    monkeypatch.setenv("VLLM_MARLIN_INPUT_DTYPE", "int8")
    for name in ("VLLM_MARLIN_INPUT_DTYPE_LAYERS", "VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    utils = _marlin_utils(tree)
    # GPTQ's and AWQ's get_quant_method, for the MoE layer named `prefix`.
    repacked = utils.get_marlin_input_dtype(MOE_LAYER)
    marlin_utils = LooseAutoStub("vllm.model_executor.layers.quantization.utils.marlin_utils")
    marlin_utils.__dict__["get_marlin_input_dtype"] = utils.get_marlin_input_dtype
    marlin_moe = load_with_auto_stubs(
        tree / f"{MOE}/experts/marlin_moe.py",
        {marlin_utils.__name__: marlin_utils, "vllm.logger": once_logger_module()},
        loose=True)
    experts = marlin_moe.MarlinExperts(
        _moe_config(tree, MOE_LAYER), SimpleNamespace(
            use_mxfp4_w4a16=False, use_nvfp4_w4a16=False, use_int4_w4a16=True,
            use_int8_w8a16=False, use_fp8_w8a16=False))
    return repacked, experts.input_dtype


def _check_moe(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings: list[dict[str, str]] = [
        {}, {"VLLM_MARLIN_INPUT_DTYPE_LAYERS": "mlp"},
        {"VLLM_MARLIN_INPUT_DTYPE_LAYERS": "self_attn"},
        {"VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS": "experts"},
        {"VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS": r"layers\.0\."},
    ]
    seen = []
    for knobs in settings:
        repacked, kernel = _moe_dtypes(tree, monkeypatch, **knobs)
        assert kernel is repacked, (knobs, repacked, kernel)
        seen.append(kernel)
    # The knobs do choose for MoE layers: picked by "mlp", left out by "self_attn",
    # skipped by "experts", kept by a pattern naming another layer.
    assert seen == [torch.int8, torch.int8, None, None, torch.int8]


def _check_fp8_moe_repack(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fp8 MoE repack refuses 8-bit activations (Marlin has no W8A8) exactly when the
    kernel would run them: it asks by the layer's name too."""
    path = tree / "model_executor/layers/quantization/utils/marlin_utils_fp8.py"
    monkeypatch.setenv("VLLM_MARLIN_INPUT_DTYPE", "int8")
    monkeypatch.setenv("VLLM_MARLIN_INPUT_DTYPE_LAYERS", "mlp")
    prepare = exec_function(path, "prepare_fp8_moe_layer_for_marlin", {
        "torch": torch, "logger": once_logger_module().init_logger("test.marlin"),
        "get_marlin_input_dtype": _marlin_utils(tree).get_marlin_input_dtype})
    layer = SimpleNamespace(moe_config=SimpleNamespace(layer_name=MOE_LAYER))
    with pytest.raises(NotImplementedError, match="W8A8"):
        prepare(layer, None, None, None, None)


def _check_name_reaches_config(tree: Path) -> None:
    """fused_moe/layer.py gives FusedMoEConfig the layer's name, the prefix its quant
    method is resolved with; compressed-tensors hands it to its WNA16 MoE method."""
    def call_keywords(path: Path, func: str) -> list[dict[str, str]]:
        found = []
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            # `FusedMoEConfig(...)`, or 0.33.0's `(moe_config_cls or FusedMoEConfig)(...)`
            callee = node.func.values if isinstance(node.func, ast.BoolOp) else [node.func]
            if any(isinstance(c, ast.Name) and c.id == func for c in callee):
                found.append({k.arg: ast.unparse(k.value) for k in node.keywords if k.arg})
        return found

    calls = call_keywords(tree / f"{MOE}/layer.py", "FusedMoEConfig")
    assert calls and all(c.get("layer_name") == "layer_name" for c in calls), calls
    ct = tree / ("model_executor/layers/quantization/compressed_tensors/"
                 "compressed_tensors_moe/compressed_tensors_moe.py")
    calls = call_keywords(ct, "CompressedTensorsWNA16MoEMethod")
    assert calls and all(c.get("layer_name") == "layer_name" for c in calls), calls


def _int8_layers(tree: Path, monkeypatch: pytest.MonkeyPatch, **knobs: str) -> list[str]:
    monkeypatch.setenv("VLLM_MARLIN_INPUT_DTYPE", "int8")
    for name in ("VLLM_MARLIN_INPUT_DTYPE_LAYERS", "VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    utils = _marlin_utils(tree)
    dtypes = {layer: utils.get_marlin_input_dtype(layer) for layer in LAYERS}
    assert set(dtypes.values()) <= {torch.int8, None}, dtypes
    return [layer for layer, dtype in dtypes.items() if dtype is torch.int8]


def _check(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither knob: every layer, as before.
    assert _int8_layers(tree, monkeypatch) == LAYERS
    # Only the MLP projections.
    assert _int8_layers(tree, monkeypatch, VLLM_MARLIN_INPUT_DTYPE_LAYERS="mlp") == [
        "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj",
        "model.layers.47.mlp.down_proj"]
    # Everything but the last decoder layer and the head (patterns are regexes).
    assert _int8_layers(
        tree, monkeypatch,
        VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS=r"layers\.47\., ^lm_head$") == LAYERS[:4]
    # Both: the MLP projections except down_proj.
    assert _int8_layers(tree, monkeypatch, VLLM_MARLIN_INPUT_DTYPE_LAYERS="mlp,attn",
                        VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS="down_proj") == [
        "model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"]
    # The knobs choose layers for the input dtype; without one, nothing is W4A8.
    monkeypatch.delenv("VLLM_MARLIN_INPUT_DTYPE")
    monkeypatch.setenv("VLLM_MARLIN_INPUT_DTYPE_LAYERS", "mlp")
    assert _marlin_utils(tree).get_marlin_input_dtype("model.layers.0.mlp.down_proj") is None


def _check_registered(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(tree)
    monkeypatch.setenv("VLLM_MARLIN_INPUT_DTYPE_LAYERS", "mlp")
    assert envs.VLLM_MARLIN_INPUT_DTYPE_LAYERS == "mlp"
    assert envs.VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS is None
    assert {"VLLM_MARLIN_INPUT_DTYPE_LAYERS",
            "VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS"} <= set(envs.environment_variables)


def test_patched_selects_w4a8_layers(patched_vllm: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _check(patched_vllm, monkeypatch)


def test_patched_registers_knobs(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_registered(patched_vllm, monkeypatch)


def test_patched_moe_kernel_agrees_with_repack(patched_vllm: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _check_moe(patched_vllm, monkeypatch)


def test_patched_fp8_moe_repack_asks_by_name(patched_vllm: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _check_fp8_moe_repack(patched_vllm, monkeypatch)


def test_patched_moe_name_reaches_config(patched_vllm: Path) -> None:
    _check_name_reaches_config(patched_vllm)


def test_pristine_runs_every_layer_w4a8(pristine_vllm: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, monkeypatch))
