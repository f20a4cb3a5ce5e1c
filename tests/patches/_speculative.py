"""A harness for vLLM's own SpeculativeConfig (config/speculative.py): the module loaded
with its heavy imports stubbed, __post_init__ run for a DFlash draft whose ModelConfig
and ParallelConfig stand in (they would load a checkpoint), vLLM's EAGLEConfig wrapping a
real transformers config."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import AutoStub, exec_function, load_with_auto_stubs, make_module, stub_modules

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


def _iter_rope(tree: Path) -> Any:
    """vLLM's own rope-parameter reader (transformers_utils/config.py)."""
    from transformers.configuration_utils import ALLOWED_LAYER_TYPES

    tuc = tree / "transformers_utils/config.py"
    nested = exec_function(tuc, "is_rope_parameters_nested",
                           {"ALLOWED_LAYER_TYPES": ALLOWED_LAYER_TYPES, "Any": Any})
    return exec_function(tuc, "iter_rope_parameters", {
        "is_rope_parameters_nested": nested, "PreTrainedConfig": object,
        "Iterator": object, "Any": Any})


def _rope_scaling(tree: Path) -> Any:
    """vLLM's rope-parameter reader, and the patch's scaling rule where it exists."""
    iter_rope = _iter_rope(tree)
    model = tree / "config/model.py"  # extracted only while a patch of the series touches it
    if not model.exists() or "def get_rope_max_len_scaling_factor" not in model.read_text():
        return None
    return exec_function(tree / "config/model.py", "get_rope_max_len_scaling_factor", {
        "iter_rope_parameters": iter_rope, "logger": _logger("model"),
        "PreTrainedConfig": object})


def post_init(tree: Path, draft: Any, target_len: int, num_spec: int,
              spec_max_model_len: int | None = None, target_hf_overrides: Any = None,
              recorded: dict[str, Any] | None = None) -> Any:
    """Build a DFlash SpeculativeConfig through vLLM's own __post_init__; ``recorded``
    receives the keyword arguments the draft ModelConfig was built with."""
    from pydantic.fields import FieldInfo

    class ModelConfig:
        """Stands in for the draft ModelConfig (which would load the checkpoint)."""

        def __init__(self, **kwargs: Any) -> None:
            if recorded is not None:
                recorded.update(kwargs)
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
    # 0.33.0's speculative.py reads rope parameters itself (which drafts it may resize)
    hf_utils = AutoStub("vllm.transformers_utils.config")
    hf_utils.__dict__["iter_rope_parameters"] = _iter_rope(tree)
    spec = load_with_auto_stubs(tree / "config/speculative.py", {
        "vllm.transformers_utils.config": hf_utils,
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
                    dtype="bfloat16", max_logprobs=20, hf_overrides=target_hf_overrides)
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
