"""The content-addressed store: one read-only entry per step digest, written atomically.

Layout under the store root::

    objects/<digest>/        the step's output files (read-only)
    objects/<digest>.json    its derivation and, per output file, sha256, size, mode,
                             mtime_ns, inode and ctime_ns; written last: the commit marker
    sources/<sha256>         input files (patches) by content, for reproduce
    builds/<hash>.json       the closure of one build, enough to reproduce it
    roots/<name>.json        gc roots: the last build of each recipe
    gcroots/auto/<key>       indirect roots: links to the ``result`` links of projects
    temproots/ tmp/ locks/   live sessions, their work in progress, per-digest locks
                             (see temproots.py)

An entry is written into ``tmp/``, fsynced, then renamed into place, metadata last. A crash
at any point leaves at most an orphan that the next writer removes. An output is trusted by
a cheap check (its stat: size, mode, mtime, inode and ctime, the last of which no user can
set back) and is fully re-hashed before anything derived from it is committed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path

from qwen38build.digest import sha256_bytes, sha256_file, tree_digest
from qwen38build.errors import StoreError
from qwen38build.files import (
    atomic_symlink,
    atomic_write,
    fsync_dir,
    remove_tree,
    write_synced,
)
from qwen38build.store import temproots
from qwen38build.store.entry import (
    _HASHED,
    CorruptEntry,
    Entry,
    _seal,
    _stat_key,
    _well_formed,
    is_digest,
    stat_record,
)

# The no-op build imports this module (for default_root): typing, dataclasses, shutil and
# tempfile would cost more than the rest of it, so they stay out of its import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from qwen38build.store.records import Derivation, EntryRecord

ENV_STORE = "QWEN38BUILD_STORE"


def default_root() -> Path:
    """``$QWEN38BUILD_STORE``, else ``<user cache dir>/qwen38build/store``."""
    env = os.environ.get(ENV_STORE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qwen38build" / "store"


class Store:
    """A store rooted at ``root``; created on first write, never written outside it."""

    def __init__(self, root: Path) -> None:
        # Absolute, once: an entry's paths reach programs that run in other folders (nvcc
        # in a scratch folder), where a relative store path would name nothing.
        root = Path(os.path.abspath(root))
        self.root = root
        self.objects = root / "objects"
        self.sources = root / "sources"
        self.builds = root / "builds"
        self.roots = root / "roots"
        self.auto_roots = root / "gcroots" / "auto"
        self.tmp = root / "tmp"
        self.locks = root / "locks"

    # -- reading -------------------------------------------------------------------------

    def meta_path(self, digest: str) -> Path:
        return self.objects / f"{digest}.json"

    def get(self, digest: str) -> Entry | None:
        """The entry for ``digest`` if it is committed and passes the cheap check, else None."""
        entry = self.lookup(digest)
        if entry is None or not self.cheap_ok(entry):
            return None
        return entry

    def lookup(self, digest: str) -> Entry | None:
        """The committed entry for ``digest``, unchecked; None if absent or malformed."""
        try:
            meta = json.loads(self.meta_path(digest).read_bytes())
        except (FileNotFoundError, ValueError):
            return None  # absent, or torn by hand: `store verify` names it, a build replaces it
        except OSError as exc:
            raise StoreError(
                f"{self.meta_path(digest)}: unreadable store metadata: {exc}.",
                hint="run `qwen38build store verify`",
            ) from exc
        if not _well_formed(meta):
            return None
        return Entry(digest, self.objects / digest, meta)

    def verified(self, digest: str, name: str) -> Path:
        """The output ``name`` of entry ``digest``, its bytes re-hashed against the record."""
        entry = self.lookup(digest)
        if entry is None:
            raise StoreError(f"store entry {digest[:12]} is missing or malformed.",
                             hint="run `qwen38build store verify`, then rebuild")
        path = entry.file(name)
        bad = entry.bad_outputs(only=name)
        if bad:
            raise CorruptEntry(digest, bad)
        return path

    def cheap_ok(self, entry: Entry) -> bool:
        return entry.cheap_ok()

    def entries(self) -> Iterator[str]:
        if not self.objects.is_dir():
            return
        for p in sorted(self.objects.glob("*.json")):
            yield p.stem

    def trusted(self, digest: str) -> Entry | None:
        """Under the digest's lock: the entry if sound (re-hashed if its stat moved), else
        None, with whatever was there (a malformed record, changed bytes) removed."""
        entry = self.lookup(digest)
        if entry is not None and (self.cheap_ok(entry) or self.revalidate(entry)):
            return entry
        if self.meta_path(digest).exists() or (self.objects / digest).exists():
            self.remove(digest)
        return None

    def drop_if_bad(self, digest: str) -> None:
        """Under the digest's lock: remove the entry unless every byte holds (re-hashed)."""
        entry = self.lookup(digest)
        if entry is None or entry.bad_outputs():
            self.remove(digest)

    def revalidate(self, entry: Entry) -> bool:
        """After a failed cheap check: re-hash; if every byte holds, record the new stat.

        A copied or restored store moves inodes and ctimes without changing a byte; that
        must not cost a rebuild. Call with the entry's digest lock held.
        """
        if entry.bad_outputs():
            return False
        for name, rec in entry.outputs.items():
            if "link" in rec:
                continue  # checked above, and a link has no stat of its own to keep
            st = os.lstat(entry.path / name)
            mode = stat.S_IMODE(st.st_mode)
            if mode != rec.get("mode", mode) or mode not in (0o444, 0o555):
                return False  # a mode change (the exec bit) changes what the output is
            rec.update(stat_record(st, rec["sha256"]))
        atomic_write(self.meta_path(entry.digest),
                     json.dumps(entry.meta, indent=1, sort_keys=True).encode())
        return True

    # -- sessions, locks -----------------------------------------------------------------

    def hold(self) -> contextlib.AbstractContextManager[temproots.Session]:
        """This process's session (temporary roots, owned tmp dirs) for a ``with`` block."""
        return temproots.hold(self.root)

    def lock(self, digest: str) -> contextlib.AbstractContextManager[None]:
        """Hold the per-digest lock: one process realises a given step at a time."""
        return temproots.digest_lock(self.locks / f"{digest}.lock")

    def gc_lock(self, *, shared: bool = False) -> contextlib.AbstractContextManager[None]:
        return temproots.flocked(self.root / temproots.GC_LOCK, shared=shared)

    def work_dir(self, session: temproots.Session, label: str) -> Path:
        """A fresh dir under ``tmp/`` owned by ``session`` (removable once it is dead)."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        path = self.tmp / f"{session.id}.{label}.{os.urandom(6).hex()}"
        path.mkdir()
        return path

    def clean_tmp(self) -> list[str]:
        """Remove what killed processes left: their ``tmp/`` work (returned by name), their
        temporary-root files and their digest lock files."""
        dead = temproots.dead_tmp(self.root, self.tmp)
        for p in dead:
            with contextlib.suppress(OSError):  # another cleaner may be removing it too
                remove_tree(p)
        if temproots.has_dead(self.root):
            with self.gc_lock():
                temproots.live_sessions(self.root)  # unlinks the dead ones' files
        temproots.drop_stale_locks(self.locks)
        self._drop_orphans()
        for folder in (self.builds, self.roots, self.sources, self.auto_roots,
                       self.root / "history", self.root / "fastpath"):
            temproots.drop_dead_temps(folder)
        return [p.name for p in dead]

    def _drop_orphans(self) -> None:
        """Output folders a killed writer left without their record (none is ever read)."""
        if not self.objects.is_dir():
            return
        names = set(os.listdir(self.objects))
        for name in sorted(names):
            if name.endswith(".json") or f"{name}.json" in names or not is_digest(name):
                continue  # a record, an entry, or another writer's temp file: not an orphan
            with temproots.try_digest_lock(self.locks / f"{name}.lock") as got:
                if got and not self.meta_path(name).exists():
                    with contextlib.suppress(OSError):
                        remove_tree(self.objects / name)

    # -- writing -------------------------------------------------------------------------

    def add(
        self, digest: str, derivation: Derivation,
        fill: Callable[[Path], dict[str, str] | None],
    ) -> Entry:
        """Run ``fill(out_dir)`` in a temp dir and commit its files as entry ``digest``.

        ``fill`` may return the sha256 of output files it hashed while writing them (by
        relative path), so a large file is not read twice. Refuses to overwrite a committed
        entry. If ``fill`` raises, nothing is stored. Call inside ``hold()`` with the
        digest registered and its lock held.
        """
        with self.hold() as session:
            session.add([digest])
            self.objects.mkdir(parents=True, exist_ok=True)
            work = self.work_dir(session, digest[:12])
            try:
                return self._commit(digest, derivation, fill, work)
            finally:
                if work.exists():
                    remove_tree(work)

    def _commit(
        self, digest: str, derivation: Derivation,
        fill: Callable[[Path], dict[str, str] | None], work: Path,
    ) -> Entry:
        out = work / "out"
        out.mkdir()
        known = fill(out) or {}
        outputs = _seal(out, known)
        for name, rec in outputs.items():
            if "link" in rec:  # what it points at, by the sha256 its entry's record holds
                rec["target_sha256"] = self._target_sha256(rec["link"], name)
        meta: EntryRecord = {
            "digest": digest,
            "derivation": derivation,
            "outputs": outputs,
            "tree": tree_digest({k: v["sha256"] for k, v in outputs.items()}),
        }
        meta_tmp = work / "meta.json"
        write_synced(meta_tmp, json.dumps(meta, indent=1, sort_keys=True).encode())
        final = self.objects / digest
        if self.meta_path(digest).exists():
            raise StoreError(f"store entry {digest} exists; the store never overwrites.")
        if final.exists() or final.is_symlink():  # an orphan of a crash before its metadata
            remove_tree(final)
        # Two renames back to back, the record last: the folder's rename leaves its files'
        # inodes and ctimes alone; one fsync covers both (a record whose folder a power
        # cut lost fails the stat check and is rebuilt).
        out.rename(final)
        meta_tmp.rename(self.meta_path(digest))
        fsync_dir(self.objects)
        for name in outputs:
            p = final / name
            _HASHED[str(p)] = _stat_key(os.lstat(p))
        return Entry(digest, final, meta)

    def _target_sha256(self, target: str, name: str) -> str:
        dep = target.split("/")[1]
        theirs = self.lookup(dep)
        got = theirs.outputs.get(name) if theirs is not None else None
        if got is None or "link" in got:
            raise StoreError(f"link {name} points at {target}, which no entry records as a "
                             "file.")
        sha: str = got["sha256"]
        return sha

    def remove(self, digest: str) -> None:
        """Drop an entry (gc, or a corrupt entry about to be rebuilt); metadata first."""
        with contextlib.suppress(FileNotFoundError):
            self.meta_path(digest).unlink()
        final = self.objects / digest
        if final.exists() or final.is_symlink():
            remove_tree(final)

    def add_source(self, path: Path) -> str:
        """Keep an input file by content; returns its sha256. Idempotent."""
        digest = sha256_file(path)
        dest = self.sources / digest
        if not dest.exists():
            atomic_write(dest, path.read_bytes(), mode=0o444)
        return digest

    def source(self, sha256: str) -> Path | None:
        p = self.sources / sha256
        return p if p.exists() else None

    def write_json(self, path: Path, value: Any) -> None:
        """Atomically (re)write a small JSON file of the store (build records, roots)."""
        atomic_write(path, json.dumps(value, indent=1, sort_keys=True).encode())

    # -- roots ---------------------------------------------------------------------------

    def link_result(self, digest: str, link: Path) -> bool:
        """Point the symlink ``link`` at entry ``digest`` and make it an indirect root.

        Done under a temporary root on ``digest``, so gc cannot take it in between; False
        (nothing linked) if it is already gone. A store we may not write (a shared read-only
        cache) cannot be collected by us and takes no roots: the link is made alone.
        """
        target = Path(os.path.abspath(self.objects / digest))
        try:
            session_cm = self.hold()
            session = session_cm.__enter__()
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            if not self.meta_path(digest).exists():
                return False
            atomic_symlink(target, link)
            return True
        try:
            session.add([digest])
            if not self.meta_path(digest).exists():
                return False
            atomic_symlink(target, link)
            self.add_indirect_root(link)
            return True
        finally:
            session_cm.__exit__(None, None, None)

    def add_indirect_root(self, link: Path) -> None:
        """Let gc keep what the symlink ``link`` (a project's ``result``) points at."""
        link = Path(os.path.abspath(link))

        auto = self.auto_roots / sha256_bytes(str(link).encode())[:32]
        with contextlib.suppress(OSError):
            if os.readlink(auto) == str(link):
                return
        self.auto_roots.mkdir(parents=True, exist_ok=True)
        atomic_symlink(link, auto)


