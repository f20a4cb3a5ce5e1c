"""dspark-draft-quant-config: a quantized target's callable hf_overrides still reaches the
draft config, but it does not give an unquantized (bf16) drafter the target's
quantization_config; a drafter's own quantization_config is kept.

Runs vLLM's own SpeculativeConfig: __post_init__ builds the draft ModelConfig's
hf_overrides (compose_draft_hf_overrides over the target's callable), which is then
applied, as ModelConfig applies it, to real transformers configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks
from ._speculative import post_init

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")

TARGET_QUANT = {"quant_method": "gptq", "bits": 4, "group_size": 128}
DRAFT_QUANT = {"quant_method": "fp8", "activation_scheme": "dynamic"}


def quantized_target_overrides(hf_config: Any) -> Any:
    """A quantized target's launcher transform: its quantization, and a test shrink."""
    hf_config.quantization_config = dict(TARGET_QUANT)
    hf_config.num_hidden_layers = 1
    return hf_config


def _draft(quant: dict[str, Any] | None = None) -> Any:
    config = transformers.Qwen3Config(architectures=["Qwen3ForCausalLM"],
                                      num_hidden_layers=4, max_position_embeddings=65536)
    if quant is not None:
        config.quantization_config = dict(quant)
    return config


def _draft_overrides(tree: Path) -> Any:
    recorded: dict[str, Any] = {}
    post_init(tree, _draft(), 32768, 7, target_hf_overrides=quantized_target_overrides,
              recorded=recorded)
    overrides = recorded["hf_overrides"]
    assert callable(overrides), overrides
    return overrides


def _check(tree: Path) -> None:
    overrides = _draft_overrides(tree)
    # A bf16 drafter: the target's transform reaches it, its quantization does not.
    bf16 = overrides(_draft())
    assert bf16.num_hidden_layers == 1
    assert getattr(bf16, "quantization_config", None) is None, bf16.quantization_config
    # A drafter quantized in its own checkpoint keeps its own quantization.
    own = overrides(_draft(DRAFT_QUANT))
    assert own.quantization_config == DRAFT_QUANT and own.num_hidden_layers == 1


def test_patched_bf16_draft_stays_unquantized(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_pristine_draft_inherits_target_quantization(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))
