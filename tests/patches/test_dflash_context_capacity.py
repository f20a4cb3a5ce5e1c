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

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    AutoStub,
    assert_pristine_lacks,
    exec_function,
    load_with_auto_stubs,
    make_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")


class _Logger(logging.LoggerAdapter):  # type: ignore[type-arg]
    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.info(msg, *args)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.warning(msg, *args)


def _logger(name: str) -> _Logger:
    return _Logger(logging.getLogger(name), {})


class _Loose(SimpleNamespace):
    """A config stand-in whose unset fields read None."""

    def __getattr__(self, name: str) -> Any:
        return None


def _rope_scaling(tree: Path) -> Any:
    """vLLM's rope-parameter reader, and the patch's scaling rule where it exists."""
    from transformers.configuration_utils import ALLOWED_LAYER_TYPES

    tuc = tree / "transformers_utils/config.py"
    nested = exec_function(tuc, "is_rope_parameters_nested",
                           {"ALLOWED_LAYER_TYPES": ALLOWED_LAYER_TYPES, "Any": Any})
    iter_rope = exec_function(tuc, "iter_rope_parameters", {
        "is_rope_parameters_nested": nested, "PreTrainedConfig": object,
        "Iterator": object, "Any": Any})
    if "def get_rope_max_len_scaling_factor" not in (tree / "config/model.py").read_text():
        return None
    return exec_function(tree / "config/model.py", "get_rope_max_len_scaling_factor", {
        "iter_rope_parameters": iter_rope, "logger": _logger("model"),
        "PreTrainedConfig": object})


def _post_init(tree: Path, draft: Any, target_len: int, num_spec: int,
               spec_max_model_len: int | None = None) -> Any:
    """Build a DFlash SpeculativeConfig through vLLM's own __post_init__."""
    from pydantic.fields import FieldInfo

    class ModelConfig:
        """Stands in for the draft ModelConfig (which would load the checkpoint)."""

        def __init__(self, **kwargs: Any) -> None:
            self.model = kwargs["model"]
            self.hf_config = draft
            self.max_model_len = kwargs["max_model_len"] or kwargs["spec_target_max_model_len"]
            self.quantization = None
            self.registry = SimpleNamespace(inspect_model_cls=lambda archs, cfg: (None, archs[0]))

        @property
        def architectures(self) -> list[str]:
            return list(self.hf_config.architectures)

        def get_model_arch_config(self) -> None:
            return None

    eagle = load_with_auto_stubs(tree / "transformers_utils/configs/eagle.py")
    speculators = make_module("vllm.transformers_utils.configs.speculators",
                              SpeculatorsConfig=type("SpeculatorsConfig", (), {}))
    scale = _rope_scaling(tree)
    model_mod = make_module("vllm.config.model", HfOverrides=dict, ModelConfig=ModelConfig)
    if scale is not None:
        model_mod.__dict__["get_rope_max_len_scaling_factor"] = scale
    spec = load_with_auto_stubs(tree / "config/speculative.py", {
        "vllm.logger": make_module("vllm.logger", init_logger=_logger),
        "vllm.config.utils": make_module("vllm.config.utils", config=lambda cls: cls,
                                         replace=None),
        "vllm.config.model": model_mod,
        "vllm.config.parallel": make_module("vllm.config.parallel",
                                            ParallelConfig=_Loose),
        "vllm.utils.import_utils": make_module(
            "vllm.utils.import_utils", has_arctic_inference=lambda: False,
            LazyLoader=lambda *a: SimpleNamespace(QuantizationMethods=str)),
    })
    cls = spec.SpeculativeConfig
    config = cls.__new__(cls)
    for name, value in vars(cls).items():
        if isinstance(value, FieldInfo):
            setattr(config, name, value.get_default(call_default_factory=True))
    target = _Loose(max_model_len=target_len, hf_config=transformers.Qwen3Config(),
                    dtype="bfloat16", max_logprobs=20)
    config.__dict__.update(
        method="dflash", model="/models/dflash-drafter", num_speculative_tokens=num_spec,
        max_model_len=spec_max_model_len, target_model_config=target,
        target_parallel_config=_Loose(tensor_parallel_size=1))
    lazy = {"vllm": AutoStub("vllm"),
            "vllm.transformers_utils": AutoStub("vllm.transformers_utils"),
            "vllm.transformers_utils.configs": AutoStub("vllm.transformers_utils.configs"),
            "vllm.transformers_utils.configs.eagle": eagle,
            "vllm.transformers_utils.configs.speculators": speculators}
    with stub_modules(lazy):
        config.__post_init__()
    return config


def _drafter(max_positions: int, rope: dict[str, Any] | None = None) -> Any:
    kwargs: dict[str, Any] = {"max_position_embeddings": max_positions,
                              "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 1}
    if rope is not None:
        kwargs["rope_parameters"] = {"rope_theta": 1e6, **rope}
    return transformers.Qwen3Config(**kwargs)


def _rejected(tree: Path, *args: Any, **kwargs: Any) -> str:
    """The ValueError message of a rejected setup (AssertionError if it is built)."""
    try:
        _post_init(tree, *args, **kwargs)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"built a DFlash config that cannot position its context: {args}")


def _check(tree: Path) -> None:
    draft = _drafter(32768)
    # Fits exactly: 32760 + 1 + 7 == 32768; the config is built (wrapped for DFlash).
    built = _post_init(tree, draft, 32760, 7)
    assert built.draft_model_config.hf_config.model is draft
    message = _rejected(tree, _drafter(32768), 40000, 7)
    assert "40008" in message and "at most 32760" in message, message
    # Speculation stops at the speculative max_model_len, which bounds the context.
    _post_init(tree, _drafter(32768), 131072, 7, spec_max_model_len=32000)
    assert "at most 32752" in _rejected(tree, _drafter(32768), 131072, 15,
                                        spec_max_model_len=32753)


def _check_rope_scaling(tree: Path) -> None:
    # Linear RoPE scaling by 4 stretches 32,768 positions to 131,072.
    linear = {"rope_type": "linear", "factor": 4.0}
    _post_init(tree, _drafter(32768, linear), 131064, 7)
    assert "supports 131072 positions" in _rejected(tree, _drafter(32768, linear), 131065, 7)
    # YaRN configs state the scaled length already: not multiplied again.
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    _post_init(tree, _drafter(131072, yarn), 131064, 7)
    assert "supports 131072 positions" in _rejected(tree, _drafter(131072, yarn), 200000, 7)


def test_patched_rejects_overlong_context(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_accounts_for_rope_scaling(patched_vllm: Path) -> None:
    _check_rope_scaling(patched_vllm)


def test_pristine_has_no_capacity_check(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm))
