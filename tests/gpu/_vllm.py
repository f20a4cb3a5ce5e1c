"""Harness for the GPU tests of series patches: vLLM 0.32.0's own ``.py`` files, pristine and
patched, loaded on a GPU machine where ``vllm._C`` cannot load (it needs torch 2.13).

The two trees come from ``QWEN38_VLLM_TREES`` (a folder holding ``pristine/vllm`` and
``patched/vllm``, e.g. unpacked from the ``.py`` files of the two wheels), else from the
engine's build of the recipe (where the engine and the store's wheel are present). Modules are
loaded one file at a time with the helpers of ``tests/patches/_helpers.py``: every vLLM import
they make is a stub unless the test hands in the real module, so no ``vllm/__init__.py`` runs.

Each test checks the patched tree and checks that the pristine tree fails the same check
(``fails_on_pristine``); figures go to ``QWEN38_GPU_RESULTS`` (a file, appended) as well as
to the test's output."""

from __future__ import annotations

import os
import tempfile
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

TREES_ENV = "QWEN38_VLLM_TREES"
RESULTS_ENV = "QWEN38_GPU_RESULTS"
# Under `nox -s gpu_tests` (QWEN38_GPU_REQUIRED=1) a missing stack fails: there, a skip would
# be a pass that tested nothing.
REQUIRED = os.environ.get("QWEN38_GPU_REQUIRED") == "1"


def missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason} (QWEN38_GPU_REQUIRED is set)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_cuda() -> None:
    """Skip (or fail, where required) the calling module without torch and a CUDA GPU."""
    try:
        import torch
    except ImportError:
        missing("torch is not installed: no GPU tests")
    if not torch.cuda.is_available():
        missing("no CUDA GPU visible to torch")


def _extract_py(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                zf.extract(name, dest)
    return dest / "vllm"


_TREES: dict[str, Path] = {}


def trees() -> tuple[Path, Path]:
    """(pristine, patched) ``vllm/`` folders."""
    if not _TREES:
        root = os.environ.get(TREES_ENV)
        if root:
            _TREES["pristine"] = Path(root) / "pristine" / "vllm"
            _TREES["patched"] = Path(root) / "patched" / "vllm"
        else:
            try:
                from tests.patches.conftest import built_wheels
                wheel, pristine_wheel, _ = built_wheels()
            except Exception as exc:  # no engine, no store: say so
                missing(f"no vLLM trees: set {TREES_ENV} or build the recipe ({exc})")
            tmp = Path(tempfile.mkdtemp(prefix="qwen38-vllm-trees-"))
            _TREES["pristine"] = _extract_py(pristine_wheel, tmp / "pristine")
            _TREES["patched"] = _extract_py(wheel, tmp / "patched")
        for tree in _TREES.values():
            if not (tree / "envs.py").is_file():
                missing(f"{tree} is not a vLLM tree")
    return _TREES["pristine"], _TREES["patched"]


def fails_on_pristine(check: Callable[[Path], object]) -> None:
    """``check`` passes on the patched tree and fails (AssertionError) on the pristine one."""
    pristine, patched = trees()
    check(patched)
    try:
        check(pristine)
    except AssertionError as exc:
        record(f"  pristine 0.32.0 fails the same check: {str(exc).splitlines()[0][:160]}")
        return
    pytest.fail("the pristine vLLM 0.32.0 tree passes the check the patch is for")


def record(line: str) -> None:
    print(line)
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


ACCELERATOR_CALLS = ("empty_cache", "synchronize", "memory_stats", "get_memory_info",
                     "memory_reserved", "memory_allocated", "reset_peak_memory_stats")


def accelerator_torch() -> Any:
    """torch, or where this torch lacks some of the ``torch.accelerator`` memory calls that
    vLLM 0.32.0 makes (it pins torch 2.13), a view of torch whose ``accelerator`` routes them
    to ``torch.cuda``."""
    import torch

    if all(hasattr(torch.accelerator, name) for name in ACCELERATOR_CALLS):
        return torch
    cuda = torch.cuda
    accelerator = SimpleNamespace(
        **{name: getattr(torch.accelerator, name) for name in dir(torch.accelerator)
           if not name.startswith("_")})
    accelerator.__dict__.update(
        empty_cache=cuda.empty_cache, synchronize=cuda.synchronize,
        memory_stats=cuda.memory_stats, memory_reserved=cuda.memory_reserved,
        memory_allocated=cuda.memory_allocated,
        reset_peak_memory_stats=cuda.reset_peak_memory_stats,
        get_memory_info=lambda device=None: cuda.mem_get_info(device))
    view = types.ModuleType("torch")
    view.__dict__.update(torch.__dict__)
    view.__dict__["accelerator"] = accelerator
    record(f"  (torch {torch.__version__} lacks some torch.accelerator memory calls: "
           "routed to torch.cuda)")
    return view


def import_from_tree(tree: Path, name: str, stubs: dict[str, types.ModuleType]) -> Any:
    """Import ``name`` (e.g. ``vllm.model_executor.layers.mamba.ops.causal_conv1d``) from
    ``tree`` with its parent packages as empty namespace modules whose ``__path__`` points
    into the tree (no package ``__init__.py`` runs) and ``stubs`` in place; the real
    sibling modules it imports load from the tree. ``sys.modules`` is restored after."""
    import importlib
    import sys

    saved = {key: mod for key, mod in sys.modules.items()
             if key == "vllm" or key.startswith("vllm.")}
    for key in saved:
        del sys.modules[key]
    parts = name.split(".")
    try:
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            module = types.ModuleType(package)
            module.__path__ = [str(tree.joinpath(*parts[1:i]))]
            sys.modules[package] = module
        sys.modules.update(stubs)
        return importlib.import_module(name)
    finally:
        for key in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[key]
        sys.modules.update(saved)


def kernel_stubs() -> dict[str, types.ModuleType]:
    """The stubs harness H uses for vLLM's Triton kernel files: real Triton, a CUDA
    platform, a logger, ``vllm.envs`` over ``os.environ``, empty compiled ops."""
    import logging

    import triton
    import triton.language as tl

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        return mod

    try:
        import triton.language.extra.libdevice as tldevice
    except ImportError:  # pragma: no cover - older Triton
        tldevice = None
    platform = SimpleNamespace(
        is_cuda=lambda: True, is_rocm=lambda: False, is_xpu=lambda: False,
        is_cpu=lambda: False, is_cuda_alike=lambda: True,
        is_arch_support_pdl=lambda: False, device_name="cuda",
        get_device_capability=lambda device_id=0: SimpleNamespace(major=9, minor=0),
        is_device_capability=lambda *a: False, has_device_capability=lambda *a: True,
        fp8_dtype=lambda: None, num_compute_units=lambda *a: 132)

    class _OnceLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
        def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
            self.info(msg, *args)

        def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
            self.warning(msg, *args)

        def debug_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
            self.debug(msg, *args)

    class _Envs(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return os.environ.get(name)

    return {
        "vllm.triton_utils": module("vllm.triton_utils", tl=tl, triton=triton,
                                    tldevice=tldevice, HAS_TRITON=True),
        "vllm.platforms": module("vllm.platforms", current_platform=platform),
        "vllm.logger": module("vllm.logger",
                              init_logger=lambda name: _OnceLogger(logging.getLogger(name), {})),
        "vllm.envs": _Envs("vllm.envs"),
        "vllm._custom_ops": module("vllm._custom_ops"),
        "vllm.v1.attention.backends.utils": module("vllm.v1.attention.backends.utils",
                                                   PAD_SLOT_ID=-1, NULL_BLOCK_ID=0),
        "vllm.utils.platform_utils": module(
            "vllm.utils.platform_utils",
            get_device_name_as_file_name=lambda *a: "NVIDIA_H200"),
    }
