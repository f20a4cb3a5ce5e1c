"""The one collector of what a build read from the project: the no-op fast path's key.

A hand-kept list of "files the build reads" drifts from the code (it once named
``fa2/README.md`` and missed what lint read elsewhere). Instead, while a build plans and
lints, Python's audit hook reports every file opened and every folder listed; what lies
inside the project (and outside the engine's own code and the interpreter's prefixes) is
the build's input set. ``recipe.load``, lint, plan and any later reader report into it
without knowing it exists.

Folders of every file read are recorded as listings too, so a file that appears next to
an input (a new patch, the FA2 diff that was missing) also changes the fingerprint.
Paths are stored relative to the project's real path (``os.path.realpath``), the same
normalisation the fast path uses on lookup.
"""

from __future__ import annotations

import os
import sys

_ACTIVE: list[Collector] = []
_HOOKED: list[bool] = []  # one element once the hook is installed


class Collector:
    """Files (by bytes) and folders (by listing) under ``root`` that were read."""

    def __init__(self, root: str, exclude: tuple[str, ...] = ()) -> None:
        self.root = os.path.realpath(root)
        self.exclude = tuple(os.path.realpath(e) + os.sep for e in exclude)
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    def _rel(self, path: object) -> str | None:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str | os.PathLike):
            return None  # a file descriptor: already covered when it was opened
        path = os.fspath(path)
        if not os.path.isabs(path) and not os.path.lexists(path):
            # The audit event does not carry ``dir_fd``: a relative name that is not there
            # from the working folder was opened inside another folder (shutil.rmtree walks
            # a temporary tree so), not read from the project.
            return None
        real = os.path.realpath(path)
        if not real.startswith(self.root + os.sep) or real.startswith(self.exclude):
            return None
        if f"{os.sep}__pycache__{os.sep}" in real:
            return None
        return os.path.relpath(real, self.root)

    def saw_file(self, path: object) -> None:
        rel = self._rel(path)
        if rel is not None and os.path.isdir(os.path.join(self.root, rel)):
            self.dirs.add(rel)  # a folder opened by descriptor: its listing is what counts
        elif rel is not None:
            self.files.add(rel)
            parent = os.path.dirname(rel)
            if parent:  # the project root's listing changes with every tool run (result)
                self.dirs.add(parent)

    def saw_dir(self, path: object) -> None:
        rel = self._rel(path)
        if rel is not None:
            self.dirs.add(rel)

    def __enter__(self) -> Collector:
        _install()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)

    def inputs(self) -> tuple[list[str], list[str]]:
        """(files, folders) read, sorted; folders that are files' parents included."""
        return sorted(self.files), sorted(self.dirs - self.files)


def probe(path: str | os.PathLike[str]) -> None:
    """Report an existence check (``exists()``/``is_file()``): no audit event covers a
    stat, so a reader that decides on a path's presence says so here. The path's folder
    is recorded as a listing, the file itself when it is there."""
    for c in _ACTIVE:
        if os.path.isfile(path):
            c.saw_file(path)
        else:
            c.saw_dir(os.path.dirname(os.fspath(path)))


def _hook(event: str, args: tuple[object, ...]) -> None:
    if not _ACTIVE:
        return
    if event == "open":
        path, mode, flags = args[0], args[1], args[2]
        reads = ("r" in mode or "+" in mode) if isinstance(mode, str) else (
            isinstance(flags, int) and flags & os.O_ACCMODE != os.O_WRONLY
            and not flags & os.O_DIRECTORY)  # a folder opened to fsync it is not read
        if reads:
            for c in _ACTIVE:
                c.saw_file(path)
    elif event in ("os.scandir", "os.listdir"):
        for c in _ACTIVE:
            c.saw_dir(args[0] if args[0] is not None else ".")


def _install() -> None:
    """Install the audit hook once per process (hooks cannot be removed; it idles)."""
    if not _HOOKED:
        sys.addaudithook(_hook)
        _HOOKED.append(True)


def default_excludes() -> tuple[str, ...]:
    """The engine's own code and the interpreter's prefixes (a venv inside the project)."""
    engine = os.path.dirname(os.path.abspath(__file__))
    return (engine, sys.prefix, sys.base_prefix, sys.exec_prefix)
