"""Unpack a source archive (tar of any compression, or zip) into a tree, safely.

An origin's archive and a ``git archive`` both hold the tree under one top folder
(``<repo>-<commit>/``); it is stripped. Only the members the recipe's ``paths`` select are
written. Every name must stay inside the tree (no absolute path, ``..``, backslash or control
character); a link must be relative and point inside the tree; a hard link, device or FIFO is
refused. Files are written 0644, or 0755 where any execute bit is set, whatever the umask.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from qwen38build.errors import InputError
from qwen38build.trees.treehash import selected


@dataclass(frozen=True)
class _Member:
    name: str  # as in the archive
    kind: str  # "file", "dir" or "link"
    executable: bool
    target: str  # a link's target
    open: object  # () -> binary file, for files


def _tar_members(tf: tarfile.TarFile) -> Iterator[_Member]:
    for info in tf:
        if info.isdir():
            yield _Member(info.name, "dir", False, "", None)
        elif info.isreg():
            yield _Member(info.name, "file", bool(info.mode & 0o111), "",
                          lambda info=info: tf.extractfile(info))
        elif info.issym():
            yield _Member(info.name, "link", False, info.linkname, None)
        elif info.type in (tarfile.XGLTYPE, tarfile.XHDTYPE):
            continue  # pax headers (git archive writes the commit id in one)
        else:
            raise _refuse(info.name, "a hard link, device or FIFO")


def _zip_members(zf: zipfile.ZipFile) -> Iterator[_Member]:
    for info in zf.infolist():
        mode = info.external_attr >> 16
        if info.is_dir():
            yield _Member(info.filename.rstrip("/"), "dir", False, "", None)
        elif (mode & 0o170000) == 0o120000:
            yield _Member(info.filename, "link", False, zf.read(info).decode(), None)
        else:
            yield _Member(info.filename, "file", bool(mode & 0o111), "",
                          lambda info=info: zf.open(info))


class _Refused(Exception):
    pass


def _refuse(name: str, why: str) -> _Refused:
    return _Refused(f"member {name!r} is {why}")


def _relative(name: str) -> PurePosixPath | None:
    """The member's path below the archive's top folder (None for the top folder itself)."""
    p = PurePosixPath(name)
    bad = (not name or p.is_absolute() or ".." in p.parts or "\\" in name or "\0" in name
           or not name.isprintable())
    if bad:
        raise _refuse(name, "outside the tree")
    return PurePosixPath(*p.parts[1:]) if len(p.parts) > 1 else None


def unpack(archive: Path, dest: Path, paths: tuple[str, ...] = ()) -> int:
    """Write the members of ``archive`` that ``paths`` select below ``dest`` (which must not
    exist); return how many files and links were written. InputError naming the archive
    and the member for anything unsafe or unreadable."""
    dest.mkdir(parents=True)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                return _write_all(_zip_members(zf), dest, paths)
        with tarfile.open(archive, "r:*") as tf:
            return _write_all(_tar_members(tf), dest, paths)
    except _Refused as exc:
        shutil.rmtree(dest)
        raise InputError(f"{archive}: {exc}; nothing of it was kept.",
                         hint="this archive is not a safe source tree") from None
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, UnicodeDecodeError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise InputError(f"{archive}: cannot be read as a tar or zip archive: {exc}.",
                         hint="fetch it again (it is damaged or not an archive)") from None


def _write_all(members: Iterator[_Member], dest: Path, paths: tuple[str, ...]) -> int:
    tops: set[str] = set()
    count = 0
    for m in members:
        top = PurePosixPath(m.name).parts[0] if m.name else ""
        tops.add(top)
        if len(tops) > 1:
            raise _refuse(m.name, "beside the archive's one top folder")
        rel = _relative(m.name)
        if rel is None or m.kind == "dir" or not selected(rel.as_posix(), paths):
            continue
        target = dest.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        # where the member really lands, through any link written before it
        parent = os.path.relpath(os.path.realpath(target.parent), os.path.realpath(dest))
        if parent == ".." or parent.startswith("../"):
            raise _refuse(m.name, "outside the tree, through a link")
        if os.path.lexists(target):
            raise _refuse(m.name, "in the archive twice")
        if m.kind == "link":
            where = posixpath.normpath(posixpath.join(parent, m.target))
            if m.target.startswith("/") or where == ".." or where.startswith("../"):
                raise _refuse(m.name, f"a link out of the tree (to {m.target!r})")
            os.symlink(m.target, target)
        else:
            mode = 0o755 if m.executable else 0o644
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            opener = m.open
            assert callable(opener)
            src: IO[bytes] | None = opener()
            assert src is not None
            with src, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(target, mode)
        count += 1
    return count
