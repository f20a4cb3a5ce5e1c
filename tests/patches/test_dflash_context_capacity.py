"""dflash-context-capacity: a DFlash setup whose context plus the drafter's fixed lookahead
(1 + num_speculative_tokens) exceeds the drafter's positional capacity is rejected when
the SpeculativeConfig is built, naming the largest context that fits; setups that fit
pass. The capacity accounts for RoPE scaling by vLLM's own rule.

Runs vLLM's own SpeculativeConfig.__post_init__ (config/speculative.py) for
method="dflash", with vLLM's EAGLEConfig wrapping a real transformers Qwen3Config as the
drafter's config, vLLM's rope-parameter reader and, where the patch adds it, the RoPE
scaling rule from config/model.py. ModelConfig and ParallelConfig stand in: they would
load a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks
from ._speculative import post_init

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")


def _drafter(max_positions: int, rope: dict[str, Any] | None = None) -> Any:
    kwargs: dict[str, Any] = {"max_position_embeddings": max_positions,
                              "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 1}
    if rope is not None:
        kwargs["rope_parameters"] = {"rope_theta": 1e6, **rope}
    return transformers.Qwen3Config(**kwargs)


def _rejected(tree: Path, *args: Any, **kwargs: Any) -> str:
    """The ValueError message of a rejected setup (AssertionError if it is built)."""
    try:
        post_init(tree, *args, **kwargs)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"built a DFlash config that cannot position its context: {args}")


def _check(tree: Path) -> None:
    draft = _drafter(32768)
    # Fits exactly: 32760 + 1 + 7 == 32768; the config is built (wrapped for DFlash).
    built = post_init(tree, draft, 32760, 7)
    assert built.draft_model_config.hf_config.model is draft
    message = _rejected(tree, _drafter(32768), 40000, 7)
    assert "40008" in message and "at most 32760" in message, message
    # Speculation stops at the speculative max_model_len, which bounds the context.
    post_init(tree, _drafter(32768), 131072, 7, spec_max_model_len=32000)
    assert "at most 32752" in _rejected(tree, _drafter(32768), 131072, 15,
                                        spec_max_model_len=32753)


def _check_rope_scaling(tree: Path) -> None:
    # Linear RoPE scaling by 4 stretches 32,768 positions to 131,072.
    linear = {"rope_type": "linear", "factor": 4.0}
    post_init(tree, _drafter(32768, linear), 131064, 7)
    assert "supports 131072 positions" in _rejected(tree, _drafter(32768, linear), 131065, 7)
    # YaRN configs state the scaled length already: not multiplied again.
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    post_init(tree, _drafter(131072, yarn), 131064, 7)
    assert "supports 131072 positions" in _rejected(tree, _drafter(131072, yarn), 200000, 7)


def test_patched_rejects_overlong_context(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_accounts_for_rope_scaling(patched_vllm: Path) -> None:
    _check_rope_scaling(patched_vllm)


def test_pristine_has_no_capacity_check(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))
