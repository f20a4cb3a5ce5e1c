"""vLLM's own ``Qwen3_VisionTransformer`` class (model_executor/models/qwen3_vl.py) built with
stand-ins for the vision layers it constructs, and vLLM's own ``UVAOffloader``
(model_executor/offloader/uva.py) with its host helpers supplied: used on CPU with a
recording offloader and on a GPU with the real one."""

from __future__ import annotations

import ast
import builtins
import itertools
import logging
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from ._helpers import Placeholder, exec_function, load_envs, load_with_auto_stubs, make_module

VL = "model_executor/models/qwen3_vl.py"
UVA = "model_executor/offloader/uva.py"
CLASS = "Qwen3_VisionTransformer"


def vision_config(depth: int, hidden: int, mlp: int, heads: int, out_hidden: int) -> Any:
    return SimpleNamespace(
        hidden_size=hidden, num_heads=heads, num_position_embeddings=64, patch_size=16,
        spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[],
        out_hidden_size=out_hidden, in_channels=3, intermediate_size=mlp,
        hidden_act="gelu_pytorch_tanh", depth=depth)


def tower_class(tree: Path, *, block: Callable[..., Any], merger: Callable[..., Any],
                offloader: Any, patch_embed: Callable[..., Any] | None = None) -> Any:
    """The tree's ``Qwen3_VisionTransformer`` with ``block(dim=..., mlp_hidden_dim=...,
    prefix=...)`` and ``merger(d_model=..., context_dim=..., ...)`` building its layers,
    ``offloader`` in place of ``UVAOffloader`` and the tree's ``envs``."""
    import torch

    source = (tree / VL).read_text()
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == CLASS:
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    namespace: dict[str, Any] = {
        name: type(name, (Placeholder,), {}) for name in names if not hasattr(builtins, name)}
    namespace.update({
        "torch": torch, "nn": torch.nn, "partial": partial, "chain": itertools.chain,
        "envs": load_envs(tree), "UVAOffloader": offloader,
        "Qwen3_VisionBlock": block, "Qwen3_VisionPatchMerger": merger,
        "Qwen3_VisionPatchEmbed": patch_embed or (lambda **kw: torch.nn.Identity()),
        "IdentityInputNorm": torch.nn.Identity, "is_vit_use_data_parallel": lambda: True,
        "get_fp8_padded_hidden_size": lambda *a: 0, "get_rope": lambda **kw: None,
        "get_vit_attn_backend": lambda **kw: None, "LRUCache": lambda capacity: {},
        "_ACTIVATION_REGISTRY": {"gelu_pytorch_tanh": None}, "__name__": "qwen3_vl"})
    return exec_function(tree / VL, CLASS, namespace)


def uva_offloader(tree: Path) -> Any:
    """The tree's ``UVAOffloader`` on pinned host memory, the zero-copy view op (``_C``)
    replaced by one that refuses (bulk copy does not call it)."""
    def no_view(cpu: Any) -> Any:
        raise AssertionError("the zero-copy view op was called in bulk-copy mode")

    mods: dict[str, ModuleType] = {
        "vllm.envs": load_envs(tree),
        "vllm.logger": make_module("vllm.logger", init_logger=logging.getLogger),
        "vllm.model_executor.offloader.base": make_module(
            "vllm.model_executor.offloader.base", BaseOffloader=object,
            should_pin_memory=lambda: True),
        "vllm.utils.gpu_sync_debug": make_module("vllm.utils.gpu_sync_debug",
                                                 gpu_sync_allowed=nullcontext),
        "vllm.utils.mem_utils": make_module("vllm.utils.mem_utils",
                                            format_gib=lambda b: f"{b / 2**30:.2f} GiB"),
        "vllm.utils.platform_utils": make_module("vllm.utils.platform_utils",
                                                 is_uva_available=lambda: True),
        "vllm.utils.torch_utils": make_module("vllm.utils.torch_utils",
                                              get_accelerator_view_from_cpu_tensor=no_view),
    }
    return load_with_auto_stubs(tree / UVA, mods).UVAOffloader
