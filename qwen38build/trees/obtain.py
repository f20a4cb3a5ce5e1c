"""Obtain a pinned source tree: from a mirror folder, else from the origin's archive.

The tree is a fixed output: whatever route it comes by, it is unpacked, only the recipe's
``paths`` are kept, and its hash (:mod:`qwen38build.trees.treehash`) must be the lock's. A
mirror folder holds archives or unpacked trees whose names carry the commit's first eight
hex digits (``flash-attention-617264c1.tar.xz``); every candidate is hashed, a wrong one is
passed over. The origin is asked only when no mirror has it, and never offline.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from qwen38build.errors import FetchError
from qwen38build.trees.archive import unpack
from qwen38build.trees.treehash import digest_of, entries

SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".zip")
TIMEOUT_S = 60


@dataclass(frozen=True)
class TreeRequest:
    """What to obtain: the recipe's declaration and, once locked, the tree's hash."""

    name: str
    repository: str
    commit: str
    paths: tuple[str, ...]
    archive: str | None
    want: str | None  # None while locking: the hash is then computed, not checked

    @property
    def archive_url(self) -> str | None:
        """The origin's archive of the commit: the recipe's ``archive``, else a GitHub
        repository's own archive route, else none."""
        if self.archive:
            return self.archive.replace("{commit}", self.commit)
        repo = self.repository.rstrip("/").removesuffix(".git")
        if repo.startswith("https://github.com/"):
            return f"{repo}/archive/{self.commit}.tar.gz"
        return None


@dataclass(frozen=True)
class Obtained:
    path: Path  # the tree, below the folder it was asked into
    tree_sha256: str
    origin: str  # where it came from, for the log
    files: dict[str, str]  # each regular file's sha256, by path: hashed once, here


def mirror_candidates(request: TreeRequest, mirrors: list[Path]) -> Iterator[Path]:
    """Archives and unpacked trees in ``mirrors`` whose names carry the commit's first eight
    hex digits, in folder order then name order."""
    key = request.commit[:8]
    for folder in mirrors:
        if not folder.is_dir():
            continue  # a mirror is a search path: one this machine lacks is passed over
        for p in sorted(folder.iterdir()):
            if key in p.name and (p.is_dir() or p.name.endswith(SUFFIXES)):
                yield p


def obtain(request: TreeRequest, mirrors: list[Path], work: Path, *, offline: bool,
           say: Callable[[str], None] = lambda _: None) -> Obtained:
    """The tree in ``work/tree`` (``work`` an empty scratch folder), hash-checked when the
    request carries one; FetchError saying where it looked when nothing matched."""
    seen: list[str] = []
    for n, candidate in enumerate(mirror_candidates(request, mirrors)):
        tree = work / f"m{n}"
        if candidate.is_dir():
            _copy_selected(candidate, tree, request.paths)
        else:
            unpack(candidate, tree, request.paths)
        found = entries(tree)
        got = digest_of(found)
        if request.want is None or got == request.want:
            return _settle(tree, work, found, str(candidate))
        seen.append(f"{candidate}: tree {got[:16]}…")
        shutil.rmtree(tree)
    url = request.archive_url
    # where the mirrors were looked for: a folder this machine lacks is named as missing, so
    # a missing mirror is not taken for a network fault
    looked = ", ".join(f"{m}{'' if m.is_dir() else ' (missing)'}" for m in mirrors) or "none"
    where = "; ".join(seen) or f"no mirror holds {request.commit[:8]} (mirrors: {looked})"
    hint = "put the tree's archive in a mirror folder ($QWEN38BUILD_SOURCES or [fetch] mirrors)"
    if offline or url is None:
        why = "offline mode forbids the origin" if offline else (
            f"{request.repository} has no known archive route (set `archive`)")
        raise FetchError(f"source {request.name!r} ({request.commit[:12]}): {where}, and {why}.",
                         hint=hint)
    say(f"fetching {url}")
    archive = work / "origin.archive"
    try:
        _download(url, archive, request.name)
    except FetchError as exc:
        raise FetchError(f"source {request.name!r} ({request.commit[:12]}): {where}, and "
                         f"{exc.message.split(': ', 1)[1]}", hint=hint) from None
    tree = work / "origin"
    unpack(archive, tree, request.paths)
    archive.unlink()
    found = entries(tree)
    got = digest_of(found)
    if request.want is not None and got != request.want:
        shutil.rmtree(tree)
        raise FetchError(
            f"source {request.name!r}: {url} unpacks to tree {got}, not the lock's "
            f"{request.want}; nothing was kept.",
            hint="if the origin legitimately changed, re-pin with `qwen38build lock`")
    return _settle(tree, work, found, url)


def _settle(tree: Path, work: Path, found: list[tuple[str, str, str]], origin: str
            ) -> Obtained:
    final = work / "tree"
    tree.rename(final)
    return Obtained(final, digest_of(found), origin,
                    {rel: sha for rel, kind, sha in found if kind != "link"})


def _copy_selected(src: Path, dest: Path, paths: tuple[str, ...]) -> None:
    """The files and links of an unpacked mirror tree that ``paths`` select, as they are
    (a link stays a link: nothing outside the tree is ever read through one)."""
    dest.mkdir(parents=True)
    for rel, kind, _ in entries(src, paths):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link":
            target.symlink_to((src / rel).readlink())
        else:
            shutil.copyfile(src / rel, target, follow_symlinks=False)
            target.chmod(0o755 if kind == "exec" else 0o644)


def _download(url: str, dest: Path, name: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp, dest.open("wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        dest.unlink(missing_ok=True)
        raise FetchError(f"source {name!r}: cannot fetch {url}: {exc}.",
                         hint="check the network, or put the archive in a mirror folder "
                              "($QWEN38BUILD_SOURCES or [fetch] mirrors)") from None
