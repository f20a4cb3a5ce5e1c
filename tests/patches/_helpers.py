"""Small helpers shared by the patch behaviour tests (no vLLM install needed)."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

_counter = 0


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
    global _counter
    _counter += 1
    modname = name or f"_qwen38_patched_{path.stem}_{_counter}"
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
            raise LookupError(f"{qualname} not found in {path}")
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
    return ns[qualname.split(".")[-1]]


def assert_pristine_lacks(check: Callable[[], object]) -> None:
    """The behaviour check must fail on the pristine tree (the patch is what adds it)."""
    try:
        check()
    except (AssertionError, LookupError, AttributeError, KeyError, TypeError, ValueError):
        return
    pytest.fail("the pristine vLLM 0.32.0 file already shows the behaviour this patch adds")
