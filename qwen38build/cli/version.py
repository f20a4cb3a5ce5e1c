"""``qwen38build --version``: the tool's version and the digest of its own source.

The version alone does not say which code runs (a checkout between releases, a local
edit), so the line also carries the implementation digest: sha256 over every module of the
package, by module name and source bytes, in name order, the way a step kind's
implementation is hashed (:func:`qwen38build.steps.implementation`) but over the whole
package. Two copies that print the same digest run the same code.
"""

from __future__ import annotations

import hashlib
import os

from qwen38build import __version__

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_digest(package: str = _PACKAGE) -> str:
    """sha256 over ``module name \\0 source \\0`` of every ``.py`` file under ``package``."""
    modules: dict[str, str] = {}
    top = os.path.basename(package)
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, package)[: -len(".py")].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                modules[".".join([top, *rel])] = path
    h = hashlib.sha256()
    for module in sorted(modules):
        with open(modules[module], "rb") as f:
            h.update(f"{module}\0".encode() + f.read() + b"\0")
    return h.hexdigest()


def version_line() -> str:
    """``qwen38build VERSION (implementation DIGEST)``."""
    return f"qwen38build {__version__} (implementation {package_digest()})"
