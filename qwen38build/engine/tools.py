"""The programs a step runs that are not part of the closure: found once, named by content.

GNU patch (the patch step), the host C++ compiler nvcc calls (the cubin steps) and a system
nvcc when the user asks for one are the machine's, not the lock's. Each is resolved the way
the step will run it (a ``PATH`` search), and its identity goes into the digest of the steps
that run it: its real path, and either the first line of its ``--version`` (GNU patch and
the host compiler, so that machines with the same release share cached steps) or the
sha256 of the executable (a system nvcc the user asked for, which no lock pins). Every
identity looked up in this process is remembered, so the no-op's key can hold the
programs' stats and miss when one is replaced.

Only the standard library: the no-op path imports :func:`stamp` and :func:`which`.
"""

from __future__ import annotations

import os

# name → (search path or "" for the caller's PATH, real path) of each identity taken.
_USED: dict[str, tuple[str, str]] = {}
# (real path, content, stat) → identity: a program is asked once per process while it stays.
_KNOWN: dict[tuple[str, bool, tuple[int, ...]], dict[str, str]] = {}


def which(name: str, path: str | None = None) -> str | None:
    """The first executable ``name`` on ``path`` (default ``$PATH``), as ``shutil.which``."""
    for folder in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def identity(name: str, path: str | None = None, *, content: bool = False) -> dict[str, str]:
    """The program ``name`` as it will be run: ``{"path", "version"}``, or with ``content``
    ``{"path", "sha256"}``; ``{"path": "none"}`` where there is none (the step that needs
    it then fails saying so)."""
    found = which(name, path)
    if found is None:
        return {"path": "none"}
    real = os.path.realpath(found)
    _USED[name] = (path or "", real)
    st = os.stat(real)
    key = (real, content, (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
    if key not in _KNOWN:
        _KNOWN[key] = _identify(name, real, path, content=content)
    return dict(_KNOWN[key])


def _identify(name: str, real: str, path: str | None, *, content: bool) -> dict[str, str]:
    if content:
        from pathlib import Path

        from qwen38build.digest import sha256_file

        return {"path": real, "sha256": sha256_file(Path(real))}
    from qwen38build.proc import environment, run

    said = run([real, "--version"], what=name, env=environment(path=path)).stdout
    return {"path": real, "version": (said.strip().splitlines() or ["unknown"])[0]}


def built_with(kind: str) -> dict[str, dict[str, str]]:
    """The identities of the machine programs a step of ``kind`` ran here (recorded beside
    each step the build made; not in digests, so that a machine that only substitutes
    needs none of them): GNU patch for the patch step, nvcc's host compiler for a cubin."""
    from qwen38build.proc import BASE_PATH

    programs: dict[str, dict[str, tuple[str, str | None]]] = {
        "patch": {"gnu_patch": ("patch", None)},
        "cubin": {"host_compiler": ("gcc", BASE_PATH)},
    }
    return {role: identity(name, path) for role, (name, path) in programs.get(kind, {}).items()}


def used() -> list[list[str]]:
    """[name, search path, real path] of every identity taken by this process, sorted."""
    return [[name, search, real] for name, (search, real) in sorted(_USED.items())]


def stamp(tools: list[list[str]]) -> str:
    """The programs ``tools`` (as :func:`used` gives them) as they stand now: where each
    resolves and its real path's stat. Any replacement of one changes it."""
    parts = []
    for name, search, _ in tools:
        found = which(name, search or None)
        if found is None:
            parts.append(f"{name}:none")
            continue
        real = os.path.realpath(found)
        try:
            st = os.stat(real)
        except OSError:
            parts.append(f"{name}:{real}:gone")
            continue
        parts.append(f"{name}:{real}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}")
    return "\n".join(parts)
