"""Input trees read one safe way: regular files only, inside the tree, as its MANIFEST lists.

A vendored tree (pthfa's sources and Python package, and any tree a step packs) is read
through :func:`manifest_files` alone, wherever it is used (planning a build, ``kernels``):
a symbolic link, a device or a pipe is refused, never followed, so no host file (an
``/etc/passwd``, a ``/proc/self/environ`` full of CI secrets) can reach a wheel; a file the
tree's MANIFEST does not list, or lists with other bytes, is refused too. Byte code and
build outputs are not sources and are passed over.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from qwen38build.digest import sha256_file
from qwen38build.errors import InputError

MANIFEST = "MANIFEST"
_LINE = re.compile(r"^(?P<sha>[0-9a-f]{64})  (?P<path>\S.*)$")
# Not sources: byte code and what a build leaves beside the sources.
SKIPPED_DIRS = frozenset({"__pycache__"})
SKIPPED_SUFFIXES = (".pyc", ".cubin", ".ptx", ".whl")
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


def manifest_files(root: Path, sub: str, *, suffixes: tuple[str, ...] | None = None
                   ) -> list[tuple[str, Path]]:
    """The regular files under ``root/sub`` (relative to ``sub``, sorted), each one listed
    with its bytes in ``root``'s MANIFEST; ``suffixes`` narrows them (``.cu``, ...)."""
    listed = read_manifest(root)
    top = root / sub
    if top.is_symlink() or not top.is_dir():
        raise InputError(f"{top}: not a folder of the tree (a link, or missing).", hint=_HINT)
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in [*dirnames, *sorted(filenames)]:
            path = Path(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise InputError(f"{path}: a symbolic link in the vendored tree {root.name}/; "
                                 "links are never followed into a build.", hint=_HINT)
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise InputError(f"{path}: not a regular file (a device, pipe or socket).",
                                 hint=_HINT)
            if name.endswith(SKIPPED_SUFFIXES) or (suffixes and not name.endswith(suffixes)):
                continue
            rel = path.relative_to(root).as_posix()
            want = listed.get(rel)
            if want is None:
                raise InputError(f"{path}: not listed in {root.name}/{MANIFEST}.", hint=_HINT)
            if sha256_file(path) != want:
                raise InputError(f"{path}: its bytes differ from {root.name}/{MANIFEST}.",
                                 hint=_HINT)
            found.append((path.relative_to(top).as_posix(), path))
    return sorted(found)
