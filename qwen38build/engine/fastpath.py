"""The no-op build: answer "already built" without loading the recipe.

Validating the recipe (pydantic), planning, and even building the argument parser cost
more than the whole no-op budget. So a successful build leaves
``fastpath/<key>.json``, keyed by the recipe's real path and bytes: every project file and
folder the build read (collected by :mod:`qwen38build.engine.reads`, not listed by hand), a
fingerprint over their bytes, the folders' listings and the engine's code, and the build
hash. A no-op re-reads those files, compares the fingerprint and stats the outputs;
anything different misses and takes the full path. Both sides normalise the project's
path with ``os.path.realpath``. Only the standard library here, and no tomllib.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from qwen38build import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_ENGINE = os.path.dirname(os.path.abspath(__file__))
DIR = "fastpath"


# Environment variables that change the plan (the nvcc choice is in the kernels' digests).
PLAN_ENV = ("QWEN38BUILD_NVCC",)


def _key(recipe_real: str, recipe_bytes: bytes) -> str:
    env = "\0".join(os.environ.get(k, "") for k in PLAN_ENV)
    head = f"qwen38build {__version__}\0{recipe_real}\0{env}\0".encode()
    return hashlib.sha256(head + recipe_bytes).hexdigest()


def fingerprint(root: Path, files: list[str], dirs: list[str]) -> str:
    """sha256 over the listed files' bytes, the listed folders' contents, and the engine."""
    h = hashlib.sha256()
    for rel in files:
        h.update(f"\0f {rel}\0".encode())
        try:
            with open(os.path.join(root, rel), "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"<missing>")
    for rel in dirs:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, rel)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            h.update(f"\0d {os.path.relpath(dirpath, root)}\0{sorted(filenames)}".encode())
    for dirpath, dirnames, filenames in os.walk(_ENGINE):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"\0{dirpath}/{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def lookup(store_root: Path, recipe_path: Path) -> dict[str, Any] | None:
    """The recorded build for this recipe if every input and output is as recorded."""
    try:
        real = os.path.realpath(recipe_path)
        with open(real, "rb") as f:
            key = _key(real, f.read())
        with open(os.path.join(store_root, DIR, f"{key}.json"), "rb") as f:
            rec: dict[str, Any] = json.loads(f.read())
        root = Path(os.path.dirname(real))
        if rec["root"] != str(root) or fingerprint(root, rec["files"], rec["dirs"]) != rec["fp"]:
            return None
        with open(os.path.join(store_root, "objects", f"{rec['build']}.json"), "rb") as f:
            meta = json.loads(f.read())
        out = os.path.join(store_root, "objects", rec["build"])
        from qwen38build.store.entry import cheap_ok

        for name, r in meta["outputs"].items():
            if not cheap_ok(r, os.path.join(out, name)):
                return None
    except (OSError, ValueError, KeyError):
        return None
    return rec


def save(
    store_root: Path, recipe_path: Path, files: list[str], dirs: list[str], build: str,
    outputs: list[list[str]],
) -> None:
    """Record a successful build for the next no-op (written atomically).

    ``files`` and ``dirs`` are relative to the recipe's folder (its real path), as
    :class:`qwen38build.engine.reads.Collector` gives them.
    """
    real = os.path.realpath(recipe_path)
    root = Path(os.path.dirname(real))
    with open(real, "rb") as f:
        key = _key(real, f.read())
    rec = {"root": str(root), "files": files, "dirs": dirs,
           "fp": fingerprint(root, files, dirs), "build": build, "outputs": outputs}
    from qwen38build.store.store import Store

    Store(store_root).write_json(store_root / DIR / f"{key}.json", rec)


def try_noop(argv: list[str]) -> int | None:
    """Answer ``[--recipe R] [--store S] build [--no-link] [-q] [--json]`` from the record.

    Returns None for any other command line, or when anything changed: then the full CLI
    runs. Kept to exactly the flags it understands, so it can never mean something else.
    """
    opts: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv) and argv[i] in ("--recipe", "--store") and i + 1 < len(argv):
        opts[argv[i]] = argv[i + 1]
        i += 2
    if argv[i : i + 1] != ["build"] or not all(v.strip() for v in opts.values()):
        return None  # an empty --store or --recipe is refused by the full CLI
    for arg in argv[i + 1 :]:
        if arg not in ("--no-link", "-q", "--quiet", "--json"):
            return None
        flags.add(arg)
    from qwen38build.store.store import default_root

    store = Path(opts["--store"]) if "--store" in opts else default_root()
    recipe = Path(opts.get("--recipe", "recipe.toml"))
    rec = lookup(store, recipe)
    if rec is None:
        return None
    from qwen38build.engine.result import report_build

    return report_build(store, rec["build"], rec["outputs"], Path(rec["root"]),
                        link="--no-link" not in flags, as_json="--json" in flags)
