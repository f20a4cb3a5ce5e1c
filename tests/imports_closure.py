"""The qwen38build modules a module imports, transitively, read from the source (ast).

Imports under ``if TYPE_CHECKING:`` are left out: they never run. Package ``__init__``
modules are left out too: they hold docstrings and the version string, never output bytes.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGE = "qwen38build"


def _is_module(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return False
    return spec is not None and spec.origin is not None and not spec.origin.endswith(
        "__init__.py")


def _source(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def _direct(name: str) -> set[str]:
    tree = ast.parse(_source(name).read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith(PACKAGE):
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if _is_module(sub) else node.module)
    return {m for m in found if _is_module(m)}


def imported_closure(name: str) -> set[str]:
    """``name`` and every qwen38build module it imports at run time, transitively."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(_direct(m) - seen)
    return seen
