"""The no-op build: answer "already built" without loading the recipe.

Validating the recipe (pydantic), planning, and even building the argument parser cost
more than the whole no-op budget. So a successful build leaves ``fastpath/<key>.json``,
keyed by the request: the recipe's real path and bytes, the outputs asked for (``--only``),
the optional series groups added (``--with``) and the compiler asked for
(``--system-nvcc``, ``$QWEN38BUILD_NVCC``). It holds every
project file and folder the build read (collected by :mod:`qwen38build.engine.reads`, not
listed by hand), a fingerprint over their bytes, real paths and the folders' listings and
the engine's code, the stat of every machine program whose identity is in a digest (GNU
patch, the host compiler, a system nvcc), and the build's answer. A no-op re-reads those,
then checks every output of the closure it hands over (the stack's links and each part's
files, by their recorded stat); anything different misses and takes the full path, so the
answer never differs from ``--rebuild``'s. Only the standard library here, and no tomllib.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from qwen38build import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from qwen38build.store.records import NoopRecord

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = "fastpath"
FORMAT = 2

# Environment variables that change the plan (the nvcc choice is in the kernels' digests).
PLAN_ENV = ("QWEN38BUILD_NVCC",)


def requested(values: list[str] | None) -> list[str] | None:
    """``--only`` values as the plan takes them: split at commas, stripped, each once, in
    order; None for the recipe's default (no ``--only``), [] when they name nothing."""
    if not values:
        return None
    return list(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))


def with_requested(values: list[str]) -> list[str]:
    """``--with`` values as the plan takes them (``inputs.groups.requested``, kept here
    in the standard library): split at commas, stripped, each once, in order."""
    return list(dict.fromkeys(n.strip().rstrip("/") for v in values for n in v.split(",")
                              if n.strip()))


def _key(recipe_real: str, recipe_bytes: bytes, only: list[str] | None, system_nvcc: bool,
         with_: list[str] | None = None) -> str:
    env = "\0".join(os.environ.get(k, "") for k in PLAN_ENV)
    wanted = "default" if only is None else ",".join(only)
    head = (f"qwen38build {__version__}\0{FORMAT}\0{recipe_real}\0{env}\0{wanted}\0"
            f"{int(system_nvcc)}\0{','.join(with_ or [])}\0").encode()
    return hashlib.sha256(head + recipe_bytes).hexdigest()


def fingerprint(root: Path, files: list[str], dirs: list[str]) -> str:
    """sha256 over the listed files' bytes and real paths, the listed folders' contents,
    and the engine's code (by stat). A file reached through a link has another real path,
    so a series folder swapped for a link misses even when the bytes agree."""
    h = hashlib.sha256()
    for rel in files:
        path = os.path.join(root, rel)
        h.update(f"\0f {rel}\0{os.path.realpath(path)}\0".encode())
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"<missing>")
    for rel in dirs:
        top = os.path.join(root, rel)
        h.update(f"\0r {rel}\0{os.path.realpath(top)}\0".encode())
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            h.update(f"\0d {os.path.relpath(dirpath, root)}\0{sorted(filenames)}".encode())
    for dirpath, dirnames, filenames in os.walk(_PACKAGE):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"\0{dirpath}/{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def closure_intact(store_root: Path, tops: list[str]) -> bool:
    """Every output of ``tops`` and of every entry their links reach has its recorded stat
    (a link: sound by what it points at, see store.entry.link_problem)."""
    from qwen38build.store.entry import cheap_ok, is_digest, link_problem

    objects = os.path.join(store_root, "objects")
    todo, seen = list(tops), set()
    while todo:
        digest = todo.pop()
        if digest in seen:
            continue
        seen.add(digest)
        if not is_digest(digest):
            return False
        with open(os.path.join(objects, f"{digest}.json"), "rb") as f:
            meta = json.loads(f.read())
        for name, rec in meta["outputs"].items():
            if "link" in rec:
                if link_problem(objects, digest, meta, name) is not None:
                    return False
                todo.append(rec["link"].split("/")[1])
            elif not cheap_ok(rec, os.path.join(objects, digest, name)):
                return False
    return True


def lookup(
    store_root: Path, recipe_path: Path, *, only: list[str] | None = None,
    system_nvcc: bool = False, with_: list[str] | None = None,
) -> NoopRecord | None:
    """The recorded answer for this request if every input and output is as recorded."""
    from qwen38build.engine.tools import stamp

    try:
        real = os.path.realpath(recipe_path)
        with open(real, "rb") as f:
            key = _key(real, f.read(), only, system_nvcc, with_)
        with open(os.path.join(store_root, DIR, f"{key}.json"), "rb") as f:
            rec: NoopRecord = json.loads(f.read())
        root = Path(os.path.dirname(real))
        if rec["root"] != str(root) or fingerprint(root, rec["files"], rec["dirs"]) != rec["fp"]:
            return None
        if stamp(rec["tools"]) != rec["stamp"]:
            return None
        if not closure_intact(store_root, [rec["build"], *(d for _, d, _ in rec["outputs"])]):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    return rec


def save(
    store_root: Path, recipe_path: Path, files: list[str], dirs: list[str], build: str,
    outputs: list[list[str]], *, only: list[str] | None = None, system_nvcc: bool = False,
    waived: list[str] | None = None, with_: list[str] | None = None,
    groups: list[str] | None = None,
) -> None:
    """Record a successful build for the next no-op of the same request (atomically).

    ``files`` and ``dirs`` are relative to the recipe's folder (its real path), as
    :class:`qwen38build.engine.reads.Collector` gives them; the machine programs are those
    whose identity the plan took (:func:`qwen38build.engine.tools.used`).
    """
    from qwen38build.engine.tools import stamp, used

    real = os.path.realpath(recipe_path)
    root = Path(os.path.dirname(real))
    with open(real, "rb") as f:
        key = _key(real, f.read(), only, system_nvcc, with_)
    tools = used()
    rec: NoopRecord = {"root": str(root), "files": files, "dirs": dirs,
           "fp": fingerprint(root, files, dirs), "tools": tools, "stamp": stamp(tools),
           "build": build, "outputs": outputs, "waived": list(waived or []),
           "groups": groups}
    from qwen38build.store.store import Store

    Store(store_root).write_json(store_root / DIR / f"{key}.json", rec)


_FLAGS = ("--no-link", "-q", "--quiet", "--json", "--system-nvcc")


def _jobs_value(arg: str) -> int:
    """N of ``-jN`` or ``--jobs=N``; 0 for anything else."""
    num = arg[7:] if arg.startswith("--jobs=") else arg[2:] if arg.startswith("-j") else ""
    return int(num) if num.isdigit() else 0


def try_noop(argv: list[str]) -> int | None:
    """Answer ``[--recipe R] [--store S] build [--only O]... [--with G]... [--system-nvcc]
    [-j N] [--no-link] [-q] [--json]`` from the record.

    Returns None for any other command line, or when anything changed: then the full CLI
    runs. Kept to exactly the flags it understands, so it can never mean something else.
    """
    opts: dict[str, str] = {}
    flags: set[str] = set()
    only: list[str] = []
    with_: list[str] = []
    i = 0
    while i < len(argv) and argv[i] in ("--recipe", "--store") and i + 1 < len(argv):
        opts[argv[i]] = argv[i + 1]
        i += 2
    if argv[i : i + 1] != ["build"] or not all(v.strip() for v in opts.values()):
        return None  # an empty --store or --recipe is refused by the full CLI
    if os.environ.get("QWEN38BUILD_OFFLINE", "").strip().lower() not in (
            "", "0", "false", "no", "off", "1", "true", "yes", "on"):
        return None  # neither yes nor no: the full CLI refuses it (cache/config.py)
    rest = argv[i + 1 :]
    while rest:
        arg = rest.pop(0)
        if arg == "--only" and rest:
            only.append(rest.pop(0))
        elif arg.startswith("--only="):
            only.append(arg.removeprefix("--only="))
        elif arg == "--with" and rest:
            with_.append(rest.pop(0))
        elif arg.startswith("--with="):
            with_.append(arg.removeprefix("--with="))
        elif arg in _FLAGS:
            flags.add(arg)
        elif arg in ("-j", "--jobs") and rest and rest[0].isdigit() and int(rest[0]) > 0:
            rest.pop(0)  # how many at once changes no answer
        elif _jobs_value(arg) > 0:
            pass  # -jN, --jobs=N
        else:
            return None
    wanted = requested(only)
    if wanted == []:
        return None  # the full CLI says --only names nothing
    from qwen38build.store.store import default_root

    store = Path(opts["--store"]) if "--store" in opts else default_root()
    recipe = Path(opts.get("--recipe", "recipe.toml"))
    rec = lookup(store, recipe, only=wanted, system_nvcc="--system-nvcc" in flags,
                 with_=with_requested(with_))
    if rec is None:
        return None
    from qwen38build.engine.result import report_build

    for line in rec.get("waived", []):  # a waiver is said on every build
        print(f"lint: {line}", file=sys.stderr)
    return report_build(store, rec["build"], rec["outputs"], Path(rec["root"]),
                        link="--no-link" not in flags, as_json="--json" in flags,
                        groups=rec.get("groups"))
