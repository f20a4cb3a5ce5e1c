"""Input trees read one safe way: regular files only, inside the tree, as its MANIFEST lists.

A vendored tree (pthfa's sources and Python package, and any tree a step packs) is read
through :func:`manifest_files` alone, wherever it is used (planning a build, ``kernels``):
a symbolic link, a device or a pipe is refused, never followed, so no host file (an
``/etc/passwd``, a ``/proc/self/environ`` full of CI secrets) can reach a wheel; a file the
tree's MANIFEST does not list, or lists with other bytes, is refused too. Byte code and
build outputs are not sources and are passed over.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from qwen38build.digest import sha256_file
from qwen38build.errors import InputError

MANIFEST = "MANIFEST"
# The tree's own bookkeeping, not its sources.
PIN_FILES = ("PIN", MANIFEST)
_LINE = re.compile(r"^(?P<sha>[0-9a-f]{64})  (?P<path>\S.*)$")
# Never sources, whatever the tree's .gitignore says: byte code, measured evidence.
ALWAYS_IGNORED = ("__pycache__/", "*.pyc", "/results/")
_HINT = ("keep regular files only in the tree, list them with their sha256 in its MANIFEST "
         "(pthfa: python3 pthfa/manifest.py), and build again")


def read_manifest(root: Path) -> dict[str, str]:
    """``root/MANIFEST``: relative path → sha256; InputError naming the line that is wrong."""
    path = root / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot be read ({exc}); the tree's files are checked "
                         "against it.", hint=_HINT) from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = _LINE.match(line)
        if m is None:
            raise InputError(f"{path}:{n}: not 'SHA256  PATH'.", hint=_HINT)
        out[m["path"]] = m["sha"]
    return out


def manifest_text(files: dict[str, str]) -> str:
    """A MANIFEST listing ``files`` (relative path → sha256), sorted by path, in the format
    :func:`read_manifest` reads."""
    return "".join(f"{sha}  {rel}\n" for rel, sha in sorted(files.items()))


def manifest_files(root: Path, sub: str, *, suffixes: tuple[str, ...] | None = None
                   ) -> list[tuple[str, Path]]:
    """The regular files under ``root/sub`` (relative to ``sub``, sorted), each one listed
    with its bytes in ``root``'s MANIFEST; ``suffixes`` narrows them (``.cu``, ...)."""
    listed = read_manifest(root)
    found = []
    for rel, path in _regular_files(root, sub, suffixes):
        want = listed.get(rel)
        if want is None:
            raise InputError(f"{path}: not listed in {root.name}/{MANIFEST}.", hint=_HINT)
        if sha256_file(path) != want:
            raise InputError(f"{path}: its bytes differ from {root.name}/{MANIFEST}.",
                             hint=_HINT)
        found.append((path.relative_to(root / sub).as_posix(), path))
    return sorted(found)


def tree_files(root: Path, sub: str) -> list[tuple[str, Path]]:
    """The regular files under ``root/sub`` of a tree of our own (no MANIFEST: ``fa2/``),
    read as safely as a vendored one: a link or a device is refused, never followed."""
    return sorted((path.relative_to(root / sub).as_posix(), path)
                  for _, path in _regular_files(root, sub, None))


def _regular_files(root: Path, sub: str, suffixes: tuple[str, ...] | None
                   ) -> list[tuple[str, Path]]:
    """(path relative to ``root``, path) of every source file under ``root/sub``."""
    top = root / sub
    if top.is_symlink() or not top.is_dir():
        raise InputError(f"{top}: not a folder of the tree (a link, or missing).", hint=_HINT)
    found: list[tuple[str, Path]] = []
    ignore = ignore_patterns(root)
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames
                             if not ignored(_rel(root, Path(dirpath, d)) + "/x", ignore))
        for name in [*dirnames, *sorted(filenames)]:
            path = Path(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise InputError(f"{path}: a symbolic link in the tree {root.name}/; "
                                 "links are never followed into a build.", hint=_HINT)
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise InputError(f"{path}: not a regular file (a device, pipe or socket).",
                                 hint=_HINT)
            rel = path.relative_to(root).as_posix()
            if rel in PIN_FILES or ignored(rel, ignore) or (
                    suffixes and not name.endswith(suffixes)):
                continue
            found.append((rel, path))
    return found


def source_files(root: Path) -> list[str]:
    """The files of the tree ``root`` that its MANIFEST must list: every file but PIN,
    MANIFEST and what is ignored (byte code, results/, and the tree's own ``.gitignore``:
    simple patterns such as ``*.cubin`` or ``/build/``, so kernels built in place are not
    sources). The one definition of a vendored tree's sources: the lint checks MANIFEST
    against it, a build reads the tree through :func:`manifest_files`."""
    patterns = ignore_patterns(root)
    out: list[str] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel in PIN_FILES or ignored(rel, patterns):
            continue
        out.append(rel)
    return out


def ignore_patterns(root: Path) -> list[str]:
    """:data:`ALWAYS_IGNORED` and the simple patterns of ``root/.gitignore``."""
    try:
        text = (root / ".gitignore").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    own = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [*ALWAYS_IGNORED, *own]


def ignored(rel: str, patterns: Iterable[str]) -> bool:
    """Whether the tree-relative path ``rel`` matches a .gitignore-style pattern: ``dir/``
    matches a folder on the path, a leading ``/`` (or an inner one) anchors at the top."""
    parts = rel.split("/")
    for pattern in patterns:
        directory = pattern.endswith("/")
        pat = pattern.strip("/")
        anchored = pattern.startswith("/") or "/" in pat
        candidates = parts[:-1] if directory else parts
        if anchored:
            prefixes = ["/".join(parts[: k + 1]) for k in range(len(candidates))]
            if any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
                return True
        elif any(fnmatch.fnmatchcase(c, pat) for c in candidates):
            return True
    return False


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()
