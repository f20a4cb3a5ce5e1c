"""Small helpers shared by the patch behaviour tests (no vLLM install needed)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import itertools
import json
import logging
import shutil
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

_counter = itertools.count(1)


@contextmanager
def stub_modules(stubs: dict[str, types.ModuleType]) -> Iterator[None]:
    """Place stub modules in sys.modules for the duration of an import."""
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def make_module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def load_module(path: Path, stubs: dict[str, types.ModuleType] | None = None,
                name: str | None = None) -> types.ModuleType:
    """Import one module file by path under a unique name, with stubs in place."""
    modname = name or f"_qwen38_patched_{path.stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with stub_modules(stubs or {}):
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(modname, None)
    return module


def extract_source(path: Path, qualname: str) -> str:
    """Source of a top-level function/class, or Class.method, from a file."""
    tree = ast.parse(path.read_text())
    parts = qualname.split(".")
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in parts:
        node = next(
            (n for n in body
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
             and n.name == part),
            None,
        )
        if node is None:
            raise AssertionError(f"{qualname} not found in {path}")
        body = getattr(node, "body", [])
    assert node is not None
    seg = ast.get_source_segment(path.read_text(), node)
    assert seg is not None
    # Dedent a method body to top level.
    lines = seg.splitlines()
    indent = getattr(node, "col_offset", 0)
    return "\n".join([lines[0]] + [ln[indent:] for ln in lines[1:]]) + "\n"


def exec_function(path: Path, qualname: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """Exec the source of one function from ``path`` in ``namespace``; return it."""
    src = extract_source(path, qualname)
    ns = dict(namespace)
    exec(compile(src, f"{path}:{qualname}", "exec"), ns)
    func: Callable[..., Any] = ns[qualname.rsplit(".", maxsplit=1)[-1]]
    return func


def pin_file(tree: Path, *where: str) -> Path:
    """The first of ``where`` (paths under vllm/, where the file lived pin by pin, oldest
    first) that ``tree`` holds: a file upstream moved is found at either pin."""
    for rel in where:
        if (tree / rel).exists():
            return tree / rel
    raise FileNotFoundError(f"none of {', '.join(where)} in {tree}")


class Either:
    """The attributes of several modules, the first that has one wins: a module upstream
    split (0.33.0's v1/core/kv_cache_planning.py out of kv_cache_utils.py) read as one."""

    def __init__(self, *modules: types.ModuleType) -> None:
        self._modules = modules

    def __getattr__(self, name: str) -> Any:
        for module in self._modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(name)


def assert_pristine_lacks(check: Callable[[], object]) -> None:
    """The behaviour check must fail on the pristine tree (the patch is what adds it)."""
    try:
        check()
    except AssertionError:
        return
    from .conftest import PIN

    pytest.fail(f"the pristine vLLM {PIN} file already shows the behaviour this patch adds")


class Placeholder:
    """Stands in for any vLLM class or function a module imports but the test never uses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __class_getitem__(cls, item: Any) -> type[Placeholder]:
        return cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def __getattr__(self, name: str) -> Any:
        return Placeholder()


class AutoStub(types.ModuleType):
    """A stub module: any attribute is a fresh placeholder class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (Placeholder,), {})
        setattr(self, name, value)
        return value


class _LooseMeta(type):
    """Class-level attributes of a loose placeholder class are placeholders too."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return LoosePlaceholder()


class LoosePlaceholder(Placeholder, metaclass=_LooseMeta):
    """A placeholder that also stands in at class level and in ``|`` expressions
    (module-level code of model files reads class attributes of what it imports)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return LoosePlaceholder()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __or__(self, other: Any) -> Any:
        return self

    def __ror__(self, other: Any) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Used as a decorator (``@REGISTRY.register(...)``), it hands the class or
        # function back.
        if len(args) == 1 and not kwargs and (isinstance(args[0], type)
                                              or inspect.isfunction(args[0])):
            return args[0]
        return LoosePlaceholder()


class LooseAutoStub(AutoStub):
    """An AutoStub whose classes are loose placeholders."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _LooseMeta(name, (LoosePlaceholder,), {})
        setattr(self, name, value)
        return value


def _imported_modules(path: Path, package: str | None = None) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level and package:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            names.add(f"{base}.{node.module}" if node.module else base)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def load_with_auto_stubs(path: Path, overrides: dict[str, types.ModuleType] | None = None,
                         prefixes: tuple[str, ...] = ("vllm",),
                         package: str | None = None, loose: bool = False) -> types.ModuleType:
    """Import ``path`` with every module it imports under ``prefixes`` replaced by an
    AutoStub (``overrides`` wins; vllm.logger gives real stdlib loggers). With
    ``package``, the module is loaded as a member of that package, so its relative
    imports resolve (to stubs, or to ``overrides``). ``loose`` stubs with
    LooseAutoStub."""
    stub_cls = LooseAutoStub if loose else AutoStub
    logger_stub = AutoStub("vllm.logger")
    logger_stub.__dict__["init_logger"] = logging.getLogger
    stubs: dict[str, types.ModuleType] = {"vllm.logger": logger_stub}
    for name in sorted(_imported_modules(path, package)):
        if name.split(".")[0] in prefixes and name not in stubs:
            stubs[name] = stub_cls(name)
    stubs.update(overrides or {})
    # Parent packages of every stub (``import vllm.envs`` binds ``vllm`` first).
    for name in list(stubs):
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in stubs:
                stubs[parent] = stub_cls(parent)
    # Let `from pkg import sub` find submodule stubs as attributes of the parent stub.
    for name, mod in stubs.items():
        parent, _, child = name.rpartition(".")
        if parent in stubs and child:
            setattr(stubs[parent], child, mod)
    modname = f"{package}.{path.stem}" if package else None
    return load_module(path, stubs, name=modname)


def load_envs(tree: Path) -> types.ModuleType:
    """Load vllm/envs.py (stdlib-only at import; compile_factors' lazy imports stubbed)."""
    def normalize_value(value: Any) -> Any:
        json.dumps(value, default=str)
        return value

    stubs = {
        "vllm": AutoStub("vllm"),
        "vllm.config": AutoStub("vllm.config"),
        "vllm.config.utils": make_module("vllm.config.utils", normalize_value=normalize_value),
        "vllm.utils": AutoStub("vllm.utils"),
        "vllm.utils.torch_utils": make_module(
            "vllm.utils.torch_utils", is_torch_equal_or_newer=lambda v: True),
    }
    mod = load_module(tree / "envs.py")
    mod.__dict__["_qwen38_stubs"] = stubs
    return mod


@contextmanager
def envs_stubs_active(envs_mod: types.ModuleType) -> Iterator[None]:
    """Keep the stubs envs.compile_factors() imports lazily in place while it runs."""
    with stub_modules(envs_mod.__dict__["_qwen38_stubs"]):
        yield


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def tree_before(pristine: Path, dest: Path, topic: str) -> Path:
    """A copy of the pristine files with the series applied up to, not including, ``topic``."""
    # Imported here: the GPU tests use these helpers where the engine is not installed.
    from .conftest import PATCHES_DIR, SERIES

    tree = dest / f"before-{topic}"
    shutil.copytree(pristine, tree)
    for name in SERIES[: SERIES.index(topic)]:
        patch = PATCHES_DIR / f"{name}.patch"
        subprocess.run(
            ["patch", "-p1", "--fuzz", "0", "--forward", "--batch", "--quiet", "-i", str(patch)],
            cwd=tree, check=True, capture_output=True,
        )
    return tree


def load_kv_cache_interface(tree: Path) -> types.ModuleType:
    """vLLM's v1/kv_cache_interface.py (the real KV cache spec classes) on CPU torch,
    with its own math, layout and spec-registry modules; only the attention backend
    registry and the dtype-size helper stand in."""
    import enum

    import torch

    class MambaAttentionBackendEnum(enum.Enum):
        MAMBA1 = "MAMBA1"
        MAMBA2 = "MAMBA2"
        SHORT_CONV = "SHORT_CONV"
        LINEAR = "LINEAR"
        GDN_ATTN = "GDN_ATTN"

    def get_dtype_size(dtype: torch.dtype) -> int:
        return int(torch.tensor([], dtype=dtype).element_size())

    logger_mod = make_module("vllm.logger", init_logger=logging.getLogger)
    math_utils = load_module(tree / "utils/math_utils.py")
    layout = load_module(tree / "v1/kv_cache_layout.py")
    registry = load_module(tree / "v1/kv_cache_spec_registry.py",
                           {"vllm.logger": logger_mod})
    mod = load_with_auto_stubs(tree / "v1/kv_cache_interface.py", {
        "vllm.logger": logger_mod,
        "vllm.utils.math_utils": math_utils,
        "vllm.utils.torch_utils": make_module("vllm.utils.torch_utils",
                                              get_dtype_size=get_dtype_size),
        "vllm.v1.attention.backends.registry": make_module(
            "vllm.v1.attention.backends.registry",
            MambaAttentionBackendEnum=MambaAttentionBackendEnum),
        "vllm.v1.kv_cache_layout": layout,
        "vllm.v1.kv_cache_spec_registry": registry,
    })
    quant_mode = getattr(mod, "get_kv_quant_mode", None)
    if quant_mode is not None and "vllm.config.cache" in inspect.getsource(quant_mode):
        # 0.33.0 asks vllm.config.cache for a registered dtype handler first (a lazy
        # import): none is registered here, so the dtype table decides, as it does in vLLM.
        cache_stub = {"vllm": make_module("vllm"), "vllm.config": make_module("vllm.config"),
                      "vllm.config.cache": make_module(
                          "vllm.config.cache", get_kv_cache_dtype_handler=lambda name: None)}

        def get_kv_quant_mode(kv_cache_dtype: str) -> Any:
            with stub_modules(cache_stub):
                return quant_mode(kv_cache_dtype)

        mod.__dict__["get_kv_quant_mode"] = get_kv_quant_mode
    return mod


class OnceLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """vLLM's logger interface (``info_once`` and friends) over a stdlib logger."""

    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.info(msg, *args)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.warning(msg, *args)

    def debug_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.debug(msg, *args)


def once_logger_module() -> types.ModuleType:
    """A vllm.logger stand-in whose init_logger gives OnceLoggers."""
    mod = LooseAutoStub("vllm.logger")
    mod.__dict__["init_logger"] = lambda name: OnceLogger(logging.getLogger(name), {})
    return mod
