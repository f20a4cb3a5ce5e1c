"""The step kinds. Each module exposes ``KIND``, ``IMPLEMENTATION`` and ``run(ctx) -> None``.

A kind's digest covers its implementation: the sha256 of the source of every qwen38build
module that can decide its output bytes, that is the kind's module and the modules in its
``IMPLEMENTATION`` (the engine's, plus wheelzip, gnupatch, ... as it uses them). Chosen over
golden-digest tests because it is mechanical: nobody has to remember a bump, and the test
``tests/test_store.py::test_declared_implementation_covers_every_imported_module`` fails
when a kind imports a module its list lacks. The price is that an edit which changes no
bytes (a comment) also misses the cache once.

A fixed-output kind (``FIXED_OUTPUT = True``, the fetch) has no implementation in its
digest: its output is checked against the sha256 that the digest holds, so no code can
change its bytes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from qwen38build.errors import InputError

if TYPE_CHECKING:
    from qwen38build.engine.step import Step

ENGINE = (
    "qwen38build.digest", "qwen38build.errors", "qwen38build.engine.executor",
    "qwen38build.engine.report", "qwen38build.engine.step", "qwen38build.store.store",
    "qwen38build.store.temproots", "qwen38build.files", "qwen38build.store.entry",
    "qwen38build.proc", "qwen38build.inputs.env",
)
FIXED = "fixed-output"
ALL = "all"  # a kind's RUNTIME: every dependency is a runtime reference (a stack's parts)
# The kinds, each the module that runs it.
KINDS = {
    "fetch": "qwen38build.steps.fetch",
    "patch": "qwen38build.steps.patch",
    "wheel": "qwen38build.steps.wheel",
    "cubin": "qwen38build.steps.cubin",
    "pthfa-wheel": "qwen38build.steps.pthfa_wheel",
    "toolchain": "qwen38build.steps.toolchain",
    "pylock": "qwen38build.steps.pylock",
    "stack": "qwen38build.steps.stack",
    "source": "qwen38build.steps.source",
    "tree-patch": "qwen38build.steps.tree_patch",
    "fa2-lib": "qwen38build.steps.fa2_lib",
    "fa2-wheel": "qwen38build.steps.fa2_wheel",
    "py-trees": "qwen38build.steps.py_trees",
}


def kind_module(kind: str) -> ModuleType:
    """The module of step kind ``kind``: ``KIND``, ``IMPLEMENTATION`` and ``run(ctx)``."""
    try:
        return importlib.import_module(KINDS[kind])
    except KeyError:
        raise InputError(f"unknown step kind {kind!r}.") from None


def runtime_deps(step: Step) -> list[Step]:
    """The dependencies ``step``'s outputs need at run time (its kind's ``RUNTIME``: the
    dependency names, or ``ALL``), as opposed to those it needs only to be built. A machine
    that substitutes a step fetches these and nothing else of its closure."""
    wanted = getattr(kind_module(step.kind), "RUNTIME", ())
    return [d for name, d in step.deps if wanted == ALL or name in wanted]


def modules_of(kind: str) -> list[str]:
    """The modules whose source makes up ``kind``'s implementation, sorted."""
    module = kind_module(kind)
    declared: tuple[str, ...] = module.IMPLEMENTATION
    return sorted({module.__name__, *declared})


@functools.cache
def implementation(kind: str) -> str:
    """``kind``'s implementation value: a hash of its modules' source, or FIXED."""
    if getattr(kind_module(kind), "FIXED_OUTPUT", False):
        return FIXED
    h = hashlib.sha256()
    for name in modules_of(kind):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"module {name} of step kind {kind} has no source file")
        h.update(f"{name}\0".encode() + Path(spec.origin).read_bytes() + b"\0")
    return h.hexdigest()
