"""Files written so that a crash never leaves half of one: atomic write and link, fsync, removal.

Kept free of third-party imports and of typing: the no-op build path imports it."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def temp_name(path: Path) -> Path:
    """A fresh name beside ``path``: never fixed, so concurrent writers never collide."""
    return path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` all at once: random temp name, fsync, rename.

    The file gets exactly ``mode``, whatever the user's umask: what the tool writes is the
    same on every machine.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_symlink(target: Path, link: Path) -> None:
    """Point ``link`` at ``target`` in one rename (a temp link of a random name first)."""
    tmp = temp_name(link)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """rm -rf that also removes read-only store entries."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return

    for dirpath, _, _ in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(dirpath, stat.S_IRWXU)
    import shutil

    shutil.rmtree(path)
