"""The hash of a source tree by content, as Nix's NAR hash is: not of an archive's bytes.

Every regular file and symbolic link below the root, in the order of their POSIX paths
(byte order), contributes one line ``<kind> <sha256> <path>``: the kind is ``file``,
``exec`` (any execute bit) or ``link`` (the sha256 is then of the link's target text). No
time, owner or other mode bit, no directory, no compression: a ``git archive`` of a commit
and the origin's archive of it hash the same. Only files under ``paths`` count, when given.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from qwen38build.digest import sha256_file

KINDS = ("file", "exec", "link")


def selected(rel: str, paths: tuple[str, ...]) -> bool:
    """True when ``rel`` is one of ``paths`` or below one (every path when none is named)."""
    return not paths or any(rel == p or rel.startswith(p + "/") for p in paths)


def entries(root: Path, paths: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """(path, kind, sha256) of every file and link below ``root`` that ``paths`` select,
    sorted by path; anything else (a device, a socket) is an error, never skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        # a link to a folder is a link: os.walk lists it among dirnames and does not descend
        for name in [*filenames, *(d for d in dirnames if (here / d).is_symlink())]:
            p = here / name
            rel = p.relative_to(root).as_posix()
            if not selected(rel, paths):
                continue
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out.append((rel, "link", hashlib.sha256(os.readlink(p).encode()).hexdigest()))
            elif stat.S_ISREG(st.st_mode):
                kind = "exec" if st.st_mode & 0o111 else "file"
                out.append((rel, kind, sha256_file(p)))
            else:
                raise ValueError(f"{p}: neither a file nor a link")
    return sorted(out, key=lambda e: e[0].encode())


def tree_hash(root: Path, paths: tuple[str, ...] = ()) -> str:
    """The tree's hash (64 hex digits) over :func:`entries`."""
    return digest_of(entries(root, paths))


def digest_of(found: list[tuple[str, str, str]]) -> str:
    """The tree hash of :func:`entries`' result (hashed once, used twice by a fetch)."""
    h = hashlib.sha256()
    for rel, kind, digest in found:
        h.update(f"{kind} {digest} {rel}\n".encode())
    return h.hexdigest()
