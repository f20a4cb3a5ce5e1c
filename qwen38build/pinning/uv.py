"""Where the pinned uv is: the binary the ``uv`` package (a dependency) ships."""

from __future__ import annotations

import functools

from qwen38build.errors import Qwen38BuildError
from qwen38build.proc import inherited, run


@functools.cache
def path() -> str:
    """The uv executable of the installed ``uv`` package."""
    try:
        import uv
    except ImportError:
        raise Qwen38BuildError(
            "the uv package is not installed beside qwen38build.",
            hint="reinstall qwen38build (uv is one of its pinned dependencies)",
        ) from None
    return str(uv.find_uv_bin())


@functools.cache
def version() -> str:
    """``uv --version``'s number, recorded beside each lock it writes."""
    parts = run([path(), "--version"], what="uv", env=inherited()).stdout.split()
    return parts[1] if len(parts) > 1 else "unknown"
