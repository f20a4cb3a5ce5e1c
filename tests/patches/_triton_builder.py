"""vLLM's real TRITON_ATTN module (v1/attention/backends/triton_attn.py) loaded without the
engine: its metadata builder, Impl and (where the series adds them) the 3D scratch plan and
pool, with a fake VllmConfig. Shared by the scratch rows' CPU tests and their GPU tests (the
builder on a CUDA device)."""

from __future__ import annotations

import enum
import logging
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ._helpers import (
    LooseAutoStub,
    load_kv_cache_interface,
    load_module,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
)

TRITON = "v1/attention/backends/triton_attn.py"


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = 3
    FULL_AND_PIECEWISE = 4


class AttentionType:
    DECODER = "decoder"
    ENCODER = "encoder"
    ENCODER_ONLY = "encoder_only"
    ENCODER_DECODER = "encoder_decoder"


class _Builder:
    """vLLM's AttentionMetadataBuilder constructor (v1/attention/backend.py), no more."""

    def __init__(self, kv_cache_spec: Any, layer_names: Any, vllm_config: Any,
                 device: Any) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = layer_names
        self.vllm_config = vllm_config
        self.device = device

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


def fake_config(*, hq: int = 16, hkv: int = 4, d: int = 128, max_num_seqs: int = 8,
                max_num_batched_tokens: int = 2048, capture_sizes: list[int] | None = None,
                ubatching: bool = False) -> Any:
    """A VllmConfig stand-in: FULL graphs when ``capture_sizes`` is given."""
    pc = SimpleNamespace(use_ubatching=ubatching)
    return SimpleNamespace(
        model_config=SimpleNamespace(
            get_num_attention_heads=lambda p: hq, get_num_kv_heads=lambda p: hkv,
            get_head_size=lambda: d, rswa_window=None),
        parallel_config=pc,
        compilation_config=SimpleNamespace(
            cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE if capture_sizes
            else CUDAGraphMode.NONE,
            cudagraph_capture_sizes=capture_sizes or []),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens),
        speculative_config=None)  # 0.33.0 sizes its own multi-query 3D rows from it


def load(tree: Path, *, cuda: bool = False, current_config: Any = None) -> types.ModuleType:
    """triton_attn.py with its engine imports stubbed. ``cuda``: the platform says CUDA
    (sm90); ``current_config``: what get_current_vllm_config_or_none returns."""
    import torch

    platform = SimpleNamespace(
        is_cuda=lambda: cuda, is_cuda_alike=lambda: cuda, is_rocm=lambda: False,
        is_xpu=lambda: False, fp8_dtype=lambda: torch.float8_e4m3fn,
        is_device_capability=lambda cap: False, has_device_capability=lambda cap: True,
        num_compute_units=lambda *a: 132, get_device_name=lambda: "fake",
        get_device_capability=lambda: SimpleNamespace(
            as_version_str=lambda: "9.0", to_int=lambda: 90))
    backend = LooseAutoStub("vllm.v1.attention.backend")
    backend.__dict__.update(AttentionMetadataBuilder=_Builder, AttentionType=AttentionType,
                            AttentionImpl=object)
    config = LooseAutoStub("vllm.config")
    config.__dict__.update(CUDAGraphMode=CUDAGraphMode,
                           get_current_vllm_config_or_none=lambda: current_config)
    envs = make_module("vllm.envs", VLLM_TRITON_USE_TD=None, VLLM_SPEC_ATTN_DEBUG=False,
                       VLLM_BATCH_INVARIANT=False)
    ops = LooseAutoStub("vllm.v1.attention.ops")
    ops.__dict__["spec_decode_attn"] = SimpleNamespace(enabled=lambda: False)
    utils = LooseAutoStub("vllm.v1.attention.backends.utils")
    utils.__dict__["get_num_attention_heads_from_layers"] = lambda cfg, names: None
    return load_with_auto_stubs(tree / TRITON, {
        "vllm.platforms": make_module("vllm.platforms", current_platform=platform),
        "vllm.config": config,
        "vllm.envs": envs,
        "vllm.logger": once_logger_module(),
        "vllm.v1.attention.backend": backend,
        "vllm.v1.attention.ops": ops,
        "vllm.v1.attention.backends.utils": utils,
        "vllm.utils.math_utils": load_module(tree / "utils/math_utils.py"),
        "vllm.v1.kv_cache_interface": load_kv_cache_interface(tree),
    }, loose=True)


def builder(mod: types.ModuleType, config: Any, device: Any = "cpu") -> Any:
    import torch

    return mod.TritonAttentionMetadataBuilder(
        SimpleNamespace(block_size=16), ["layer.0"], config, torch.device(device))


def impl(mod: types.ModuleType, hq: int = 16, hkv: int = 4, d: int = 128) -> Any:
    return mod.TritonAttentionImpl(hq, d, d ** -0.5, hkv, None, None, "int4_per_token_head")


def records(caplog: Any, level: int, text: str = "3D attention") -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and text in r.getMessage()]
