"""The one harness of the GPU tests that load vLLM 0.32.0's `.py` files without `vllm._C`.

The GPU machine has torch 2.11 and Triton 3.6 but not the torch vLLM's compiled ops need, so a
test loads vLLM's modules straight from a tree of the package's `.py` files. Two ways, one
module:

- harness H (`install`, `load`): `vllm` and every parent package are registered as empty
  namespace modules whose `__path__` points into the tree (no `__init__.py` runs), and only
  the modules that would pull in the engine are stubbed (the platform, the logger,
  `vllm.envs` reading `os.environ`, the custom ops and, for the kernel files, `KVQuantMode`
  taken by AST from the tree's own `kv_cache_interface.py` and the two constants of
  `backends/utils.py`); `import_from_tree` does the same for one import and restores
  `sys.modules` after;
- one file at a time with the helpers of `tests/patches/_helpers.py` (every vLLM import a stub
  unless the test hands in the real module), where a test compares the patched tree with the
  pristine one in one process (`trees`, `fails_on_pristine`).

The trees: `$QWEN38_VLLM_TREE` (a folder holding `vllm/`, or a zip of it: the series' tree, as
the GPU twin of the series cuts and `nox -s gpu_tests` hand in) and `$QWEN38_VLLM_PRISTINE`
(the pristine 0.32.0 tree); or `$QWEN38_VLLM_TREES`, the zip `qwen38build build --only vllm-py`
makes (`nox -s gpu_tests` hands in a carried `result/vllm-py-trees.zip`) or a folder holding
`pristine/vllm` and `patched/vllm`; else the engine's build of the recipe, extracted here (a
machine with the store). A zip is extracted once under a folder named by its content.

The rules every GPU test shares live here too: skip without torch, a CUDA device and Triton
(`QWEN38_GPU_REQUIRED=1` turns the skip into a failure), and the figures: `record` prints a
table and writes it as `NAME.md` under `$QWEN38_GPU_RESULTS` (a folder); `record_line`
prints a line and appends it to `$QWEN38_GPU_RESULTS` (a file; in a folder, its
`results.txt`).
"""

from __future__ import annotations

import ast
import datetime
import enum
import hashlib
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

TREE_ENV = "QWEN38_VLLM_TREE"
PRISTINE_ENV = "QWEN38_VLLM_PRISTINE"
TREES_ENV = "QWEN38_VLLM_TREES"
RESULTS_ENV = "QWEN38_GPU_RESULTS"
# Under `nox -s gpu_tests` (QWEN38_GPU_REQUIRED=1) a missing stack fails: there, a skip would
# be a pass that tested nothing.
REQUIRED = os.environ.get("QWEN38_GPU_REQUIRED") == "1"
_CACHE = Path(os.environ.get("QWEN38_VLLM_TREE_CACHE", "/tmp/qwen38-vllm-tree"))


def missing(reason: str) -> None:
    """Skip the calling module (fail it, under QWEN38_GPU_REQUIRED)."""
    if REQUIRED:
        pytest.fail(f"{reason} (QWEN38_GPU_REQUIRED is set)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_cuda() -> Any:
    """torch with a CUDA device and Triton, else skip (fail under QWEN38_GPU_REQUIRED)."""
    try:
        import torch
    except ImportError:
        missing("torch is not installed: no GPU tests")
    if not torch.cuda.is_available():
        missing("no CUDA GPU visible to torch")
    try:
        import triton  # noqa: F401
    except ImportError:
        missing("Triton is not installed: the vLLM kernels need it")
    return torch


def card() -> str:
    import torch
    import triton

    p = torch.cuda.get_device_properties(0)
    return (f"{p.name} (sm{p.major}{p.minor}), torch {torch.__version__}, "
            f"Triton {triton.__version__}, {datetime.date.today().isoformat()}")


def _results_dir() -> Path | None:
    out = os.environ.get(RESULTS_ENV)
    if not out:
        return None
    path = Path(out)
    return path.parent if path.suffix else path


def record(name: str, lines: list[str]) -> None:
    """Print a result table and, with $QWEN38_GPU_RESULTS set, write it there as NAME.md."""
    text = "\n".join([f"# {name}", "", f"Card: {card()}", "", *lines, ""])
    print(text)
    out = _results_dir()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.md").write_text(text)


def record_line(line: str) -> None:
    """Print a line and append it to $QWEN38_GPU_RESULTS (a file; in a folder, results.txt)."""
    print(line)
    out = os.environ.get(RESULTS_ENV)
    if out:
        path = Path(out) if Path(out).suffix else Path(out) / "results.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def _extract_py(wheel_or_zip: Path, dest: Path, top: str = "") -> Path:
    """The ``<top>vllm/**.py`` members of a wheel or zip as ``dest/vllm/`` (returns ``dest``).

    ``top="patched/"`` reads the zip of `build --only vllm-py`: the pristine tree, then the
    files the series changed, then the ones it deleted removed. Written into a fresh folder
    renamed into place, so a run killed half way leaves no half tree that a later run would
    take for whole."""
    if (dest / "vllm").is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    with zipfile.ZipFile(wheel_or_zip) as zf:
        layers = ["pristine/", top] if top == "patched/" else [top]
        for layer in layers:
            for name in zf.namelist():
                rel = name[len(layer):]
                if (name.startswith(f"{layer}vllm/") and name.endswith(".py")
                        and ".." not in rel.split("/")):
                    out = work / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(zf.read(name))
        if top == "patched/":
            for rel in json.loads(zf.read("trees.json"))["patched_deleted"]:
                if ".." not in rel.split("/"):
                    (work / rel).unlink(missing_ok=True)
    try:
        work.rename(dest)
    except OSError:  # another run got there first: its tree is the same bytes
        shutil.rmtree(work, ignore_errors=True)
    return dest


def _cache_dir(path: Path, part: str = "") -> Path:
    """Where ``path``'s trees are extracted: by the zip's content, never by its name alone (a
    rebuilt zip under the same name must not be served an older tree)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return _CACHE / f"{path.stem}-{h.hexdigest()[:16]}" / part


def _given(path: Path) -> Path:
    """A folder holding ``vllm/`` from a folder or a zip."""
    if path.is_file():
        return _extract_py(path, _cache_dir(path, "tree"))
    return path


def _given_pair(path: Path, side: str) -> Path:
    """``side`` ("pristine" or "patched") of $QWEN38_VLLM_TREES: a folder holding both, or
    the zip `qwen38build build --only vllm-py` makes."""
    if path.is_file():
        return _extract_py(path, _cache_dir(path, side), top=f"{side}/")
    return path / side


_BUILT: dict[str, Path] = {}


def _built() -> dict[str, Path]:
    """The engine's build of the recipe and the pristine wheel, extracted (once)."""
    if not _BUILT:
        root = Path(__file__).resolve().parents[2]
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        try:
            from tests.patches.conftest import built_wheels
            wheel, pristine_wheel, _ = built_wheels()
        except Exception as exc:  # no engine, no store: say so
            missing(f"no vLLM trees: set {TREE_ENV} or build the recipe ({exc})")
        # a store entry's folder is named by its digest: content-addressed already, so the
        # 326 MB wheels are not hashed again here
        _BUILT["patched"] = _extract_py(wheel, _CACHE / wheel.parent.name / "tree")
        _BUILT["pristine"] = _extract_py(pristine_wheel,
                                         _CACHE / pristine_wheel.parent.name / "tree")
    return _BUILT


def tree_root() -> Path:
    """The folder that holds the (patched) `vllm/` package to test."""
    given = os.environ.get(TREE_ENV)
    if given:
        return _given(Path(given))
    both = os.environ.get(TREES_ENV)
    if both:
        return _given_pair(Path(both), "patched")
    return _built()["patched"]


def pristine_root() -> Path:
    """The folder that holds the pristine 0.32.0 `vllm/` package."""
    given = os.environ.get(PRISTINE_ENV)
    if given:
        return _given(Path(given))
    both = os.environ.get(TREES_ENV)
    if both:
        return _given_pair(Path(both), "pristine")
    if os.environ.get(TREE_ENV):
        missing(f"{TREE_ENV} is set but not {PRISTINE_ENV}: no pristine tree")
    return _built()["pristine"]


def trees() -> tuple[Path, Path]:
    """(pristine, patched) ``vllm/`` folders."""
    pristine, patched = pristine_root() / "vllm", tree_root() / "vllm"
    for tree in (pristine, patched):
        if not (tree / "envs.py").is_file():
            missing(f"{tree} is not a vLLM tree")
    return pristine, patched


def fails_on_pristine(check: Callable[[Path], object]) -> None:
    """``check`` passes on the patched tree and fails (AssertionError) on the pristine one."""
    pristine, patched = trees()
    check(patched)
    try:
        check(pristine)
    except AssertionError as exc:
        record_line(f"  pristine 0.32.0 fails the same check: {str(exc).splitlines()[0][:160]}")
        return
    pytest.fail("the pristine vLLM 0.32.0 tree passes the check the patch is for")


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

    def is_arch_support_pdl(self) -> bool:
        return False

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


def install(tree: Path | None = None, *, packages: tuple[str, ...] = (),
            kernels: bool = True) -> Path:
    """Register the namespace packages and stubs for the tree; returns the tree root.

    ``packages``: more folders of the package to register as namespace packages (e.g.
    "utils"); ``kernels=False`` leaves ``vllm.v1.kv_cache_interface`` and
    ``vllm.v1.attention.backends.utils`` to the tree (a test that needs the real ones)."""
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
                "model_executor/layers/fla", "model_executor/layers/fla/ops", "v1/worker",
                *packages):
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
    if kernels:
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
    record_line(f"  (torch {torch.__version__} lacks some torch.accelerator memory calls: "
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

    from tests.patches._helpers import OnceLogger

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        return mod

    try:
        import triton.language.extra.libdevice as tldevice
    except ImportError:  # pragma: no cover - older Triton
        tldevice = None
    platform = _Platform()

    class _RawEnvs(types.ModuleType):
        """`vllm.envs` as raw strings (None when unset), as these kernel files read it."""

        def __getattr__(self, name: str) -> Any:
            return os.environ.get(name)

    return {
        "vllm.triton_utils": module("vllm.triton_utils", tl=tl, triton=triton,
                                    tldevice=tldevice, HAS_TRITON=True),
        "vllm.platforms": module("vllm.platforms", current_platform=platform),
        "vllm.logger": module("vllm.logger",
                              init_logger=lambda name: OnceLogger(logging.getLogger(name), {})),
        "vllm.envs": _RawEnvs("vllm.envs"),
        "vllm._custom_ops": module("vllm._custom_ops"),
        "vllm.v1.attention.backends.utils": module("vllm.v1.attention.backends.utils",
                                                   PAD_SLOT_ID=-1, NULL_BLOCK_ID=0),
        "vllm.utils.platform_utils": module(
            "vllm.utils.platform_utils",
            get_device_name_as_file_name=lambda *a: "NVIDIA_H200"),
    }
