"""Harness H: vLLM 0.32.0's Triton kernels loaded from a `.py` tree, without `vllm._C`.

The GPU machine has torch 2.11 and Triton 3.6 but not the torch vLLM's compiled ops need, so
a test loads the patched kernel modules straight from a tree of the package's `.py` files:
`vllm` and every parent package are registered as empty namespace modules whose `__path__`
points into the tree (no `__init__.py` runs), and only the modules that would pull in the
engine are stubbed (the platform, the logger, `vllm.envs` reading `os.environ`, the custom
ops, `KVQuantMode` taken by AST from the tree's own `kv_cache_interface.py`, and the two
constants of `backends/utils.py`).

The tree: `$QWEN38_VLLM_TREE` (a folder holding `vllm/`, or a zip of it, as the GPU twin of
the series cuts and `nox -s gpu_tests` hand in); else the engine's build of the recipe,
extracted here (a machine with the store).
"""

from __future__ import annotations

import ast
import enum
import importlib
import logging
import os
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

TREE_ENV = "QWEN38_VLLM_TREE"
_CACHE = Path(os.environ.get("QWEN38_VLLM_TREE_CACHE", "/tmp/qwen38-vllm-tree"))


def _extract_py(wheel_or_zip: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel_or_zip) as zf:
        for name in zf.namelist():
            if name.startswith("vllm/") and name.endswith(".py") and ".." not in name:
                zf.extract(name, dest)
    return dest


def tree_root() -> Path:
    """The folder that holds the `vllm/` package to test."""
    given = os.environ.get(TREE_ENV)
    if given:
        path = Path(given)
        if path.is_file():
            dest = _CACHE / path.stem
            if not (dest / "vllm").is_dir():
                _extract_py(path, dest)
            return dest
        return path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from tests.patches.conftest import built_wheels

    wheel, _, _ = built_wheels()
    dest = _CACHE / wheel.parent.name
    if not (dest / "vllm").is_dir():
        _extract_py(wheel, dest)
    return dest


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class _Platform:
    """What the kernel modules ask of `current_platform`, answered from torch."""

    device_type = "cuda"
    device_name = "cuda"

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def fp8_dtype(self) -> Any:
        import torch

        return torch.float8_e4m3fn

    def get_device_capability(self, device_id: int = 0) -> Any:
        import torch

        major, minor = torch.cuda.get_device_capability(device_id)
        return types.SimpleNamespace(major=major, minor=minor,
                                     to_int=lambda: major * 10 + minor)

    def is_device_capability(self, cap: Any) -> bool:
        c = self.get_device_capability()
        return bool(c.major * 10 + c.minor == (cap if isinstance(cap, int)
                                               else cap[0] * 10 + cap[1]))

    def is_device_capability_family(self, cap: int) -> bool:
        return bool(self.get_device_capability().major * 10 == cap)

    def has_device_capability(self, cap: Any) -> bool:
        c = self.get_device_capability()
        want = cap if isinstance(cap, int) else cap[0] * 10 + cap[1]
        return bool(c.major * 10 + c.minor >= want)

    def num_compute_units(self, device_id: int = 0) -> int:
        import torch

        return int(torch.cuda.get_device_properties(device_id).multi_processor_count)


class _Envs(types.ModuleType):
    """`vllm.envs` read from `os.environ`: bools as 0/1, ints, else the string."""

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("VLLM_"):
            raise AttributeError(name)
        raw = os.environ.get(name)
        if raw is None:
            return False if name not in _INT_KNOBS else 0
        if name in _INT_KNOBS:
            return int(raw)
        return raw not in ("", "0", "false", "False")


_INT_KNOBS = {"VLLM_SPEC_DECODE_ATTN_QMAX", "VLLM_SPEC_ATTN_BLOCK_M"}


def _kv_quant_mode(tree: Path) -> type:
    src = (tree / "vllm/v1/kv_cache_interface.py").read_text()
    for node in ast.parse(src).body:
        if isinstance(node, ast.ClassDef) and node.name == "KVQuantMode":
            ns: dict[str, Any] = {"enum": enum, "IntEnum": enum.IntEnum, "Enum": enum.Enum}
            exec(compile(ast.Module([node], []), "kv_cache_interface.py", "exec"), ns)
            mode: type = ns["KVQuantMode"]
            return mode
    raise LookupError("KVQuantMode not found in kv_cache_interface.py")


def _namespace(name: str, path: Path | None) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)] if path is not None else []
    sys.modules[name] = mod
    return mod


def install(tree: Path | None = None) -> Path:
    """Register the namespace packages and stubs for the tree; returns the tree root."""
    tree = tree or tree_root()
    pkg = tree / "vllm"
    if not pkg.is_dir():
        raise FileNotFoundError(f"no vllm/ package under {tree}")
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    # parents only: vllm.triton_utils and vllm.utils import for real (their __init__ is light)
    for sub in ("", "v1", "v1/attention", "v1/attention/ops", "v1/attention/backends",
                "model_executor", "model_executor/layers",
                "model_executor/layers/mamba", "model_executor/layers/mamba/ops",
                "model_executor/layers/fla", "model_executor/layers/fla/ops", "v1/worker"):
        dotted = "vllm" + ("." + sub.replace("/", ".") if sub else "")
        _namespace(dotted, pkg / sub)
    plat = _namespace("vllm.platforms", None)
    plat.current_platform = _Platform()  # type: ignore[attr-defined]
    plat.vllm_version_matches_substr = lambda s: False  # type: ignore[attr-defined]
    log = _namespace("vllm.logger", None)
    log.init_logger = logging.getLogger  # type: ignore[attr-defined]
    sys.modules["vllm.envs"] = _Envs("vllm.envs")
    sys.modules["vllm"].envs = sys.modules["vllm.envs"]  # type: ignore[attr-defined]
    _namespace("vllm._custom_ops", None)
    kvi = _namespace("vllm.v1.kv_cache_interface", None)
    kvi.KVQuantMode = _kv_quant_mode(tree)  # type: ignore[attr-defined]
    utils = _namespace("vllm.v1.attention.backends.utils", None)
    utils.PAD_SLOT_ID = -1  # type: ignore[attr-defined]
    utils.NULL_BLOCK_ID = 0  # type: ignore[attr-defined]
    if os.environ.get("TRITON_INTERPRET") == "1" and not _cuda_available():
        # CPU development under Triton's interpreter: vllm.triton_utils would find no
        # active driver and hand out placeholders, so it is the real triton here.
        import triton
        import triton.language as tl

        tu = _namespace("vllm.triton_utils", None)
        tu.triton, tu.tl, tu.HAS_TRITON = triton, tl, True  # type: ignore[attr-defined]
        tu.LOG2E, tu.LOGE2 = 1.4426950408889634, 0.6931471805599453  # type: ignore[attr-defined]
    return tree


def load(module: str) -> types.ModuleType:
    """Import `vllm.<module>` from the installed tree."""
    return importlib.import_module(module)
