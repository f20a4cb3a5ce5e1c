"""marlin-int8-layer-select: VLLM_MARLIN_INPUT_DTYPE_LAYERS and
VLLM_MARLIN_INPUT_DTYPE_SKIP_LAYERS pick which Marlin layers run with the 8-bit input
dtype (W4A8); the rest keep 16-bit activations. Runs vLLM's own get_marlin_input_dtype
(marlin_utils.py, on CPU torch) with the knobs read through vLLM's own envs.py."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function, load_envs

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


def test_pristine_runs_every_layer_w4a8(pristine_vllm: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, monkeypatch))
