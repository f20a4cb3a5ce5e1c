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
from qwen38build.store import temproots

# The no-op build imports this module (for default_root): typing, dataclasses, shutil and
# tempfile would cost more than the rest of it, so they stay out of its import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

ENV_STORE = "QWEN38BUILD_STORE"
STAT_FIELDS = ("size", "mtime_ns", "ino", "ctime_ns")


def default_root() -> Path:
    """``$QWEN38BUILD_STORE``, else ``<user cache dir>/qwen38build/store``."""
    env = os.environ.get(ENV_STORE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qwen38build" / "store"


def _temp_name(path: Path) -> Path:
    """A fresh name beside ``path``: never fixed, so concurrent writers never collide."""
    return path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` all at once: random temp name, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
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
    _fsync_dir(path.parent)


def atomic_symlink(target: Path, link: Path) -> None:
    """Point ``link`` at ``target`` in one rename (a temp link of a random name first)."""
    tmp = _temp_name(link)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def stat_record(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "mtime_ns": st.st_mtime_ns,
            "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}


def is_link_target(target: str) -> bool:
    """Whether a symlink output may point there: one recorded output of a sibling entry
    (``../<digest>/<name>``), nothing else, so a link can never reach outside the store.
    A stack's result directory is made of these (see steps/stack.py)."""
    parts = target.split("/")
    return (len(parts) == 3 and parts[0] == ".." and len(parts[1]) == 64
            and all(c in "0123456789abcdef" for c in parts[1])
            and parts[2] not in ("", ".", "..") and "\0" not in parts[2])


def link_sha256(target: str) -> str:
    """What a link output's record holds as its sha256: the hash of what it points at."""
    return sha256_bytes(f"link\0{target}".encode())


def output_sha256(path: Path) -> str:
    """An output's sha256 as its record holds it (a link by its target, a file by bytes)."""
    return link_sha256(os.readlink(path)) if path.is_symlink() else sha256_file(path)


def link_ok(output: dict[str, Any], path: str | Path) -> bool:
    """A link output still points where it was recorded to."""
    try:
        return bool(os.readlink(path) == output["link"])
    except (OSError, ValueError):
        return False


def cheap_ok(output: dict[str, Any], path: str | Path) -> bool:
    """True if the file at ``path`` still has the stat recorded for it at seal time.

    ``output`` is one value of a store record's ``outputs``. Any write, chmod or rename
    moves ctime, which cannot be set back; records written before inode and ctime were kept
    compare what they have. Stdlib only: the no-op fast path calls it.
    """
    if "link" in output:
        return link_ok(output, path)
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    if "mode" in output and output["mode"] != stat.S_IMODE(st.st_mode):
        return False
    return all(output[k] == getattr(st, f"st_{k}") for k in STAT_FIELDS if k in output)


# Outputs fully hashed by this process, by path: the stat they had when they matched.
_HASHED: dict[str, tuple[int, ...]] = {}


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


class Entry:
    """A committed store entry: where its files are and what they were when written."""

    __slots__ = ("digest", "meta", "path")

    def __init__(self, digest: str, path: Path, meta: dict[str, Any]) -> None:
        self.digest = digest
        self.path = path
        self.meta = meta

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = self.meta["outputs"]
        return out

    def file(self, name: str) -> Path:
        """The output ``name`` by its recorded name; StoreError if the record has none."""
        if name not in self.outputs:
            raise StoreError(f"store entry {self.digest[:12]} records no output {name!r}.")
        return self.path / name

    def the_output(self, suffix: str) -> Path:
        """The one recorded output whose name ends in ``suffix`` (a step's ``.whl``).

        Read from the record, never by a glob: a stray file dropped into the entry is not
        an output and is never picked.
        """
        names = [n for n in self.outputs if "/" not in n and n.endswith(suffix)]
        if len(names) != 1:
            raise StoreError(
                f"store entry {self.digest[:12]} records {len(names)} '*{suffix}' outputs, "
                "not one.", hint="run `qwen38build store verify`, then rebuild")
        return self.path / names[0]

    def bad_outputs(self, only: str | None = None) -> list[str]:
        """Outputs (or just ``only``) whose bytes are not their recorded sha256; each file
        is hashed once per stat by this process."""
        bad = []
        for name, rec in self.outputs.items():
            if only is not None and name != only:
                continue
            p = self.path / name
            if "link" in rec:
                if not link_ok(rec, p):
                    bad.append(name)
                continue
            try:
                st = os.lstat(p)
            except OSError:
                bad.append(name)
                continue
            if _HASHED.get(str(p)) == _stat_key(st):
                continue
            if not stat.S_ISREG(st.st_mode) or sha256_file(p) != rec["sha256"]:
                bad.append(name)
                continue
            _HASHED[str(p)] = _stat_key(st)
        return bad


class CorruptEntry(StoreError):
    """An entry's bytes differ from its record; the executor removes and rebuilds it."""

    def __init__(self, digest: str, names: list[str]) -> None:
        self.digest = digest
        super().__init__(f"store entry {digest[:12]}: {', '.join(names)} changed after it "
                         "was written.", hint="run the build again; it rebuilds the entry")


class Store:
    """A store rooted at ``root``; created on first write, never written outside it."""

    def __init__(self, root: Path) -> None:
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
        return all(cheap_ok(rec, entry.path / name) for name, rec in entry.outputs.items())

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
            rec.update(stat_record(st))
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
        self, digest: str, derivation: dict[str, Any],
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
        self, digest: str, derivation: dict[str, Any],
        fill: Callable[[Path], dict[str, str] | None], work: Path,
    ) -> Entry:
        out = work / "out"
        out.mkdir()
        known = fill(out) or {}
        outputs = _seal(out, known)
        meta = {
            "digest": digest,
            "derivation": derivation,
            "outputs": outputs,
            "tree": tree_digest({k: v["sha256"] for k, v in outputs.items()}),
        }
        meta_tmp = work / "meta.json"
        _write_synced(meta_tmp, json.dumps(meta, indent=1, sort_keys=True).encode())
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
        _fsync_dir(self.objects)
        for name in outputs:
            p = final / name
            _HASHED[str(p)] = _stat_key(os.lstat(p))
        return Entry(digest, final, meta)

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
        from qwen38build.digest import sha256_bytes

        auto = self.auto_roots / sha256_bytes(str(link).encode())[:32]
        with contextlib.suppress(OSError):
            if os.readlink(auto) == str(link):
                return
        self.auto_roots.mkdir(parents=True, exist_ok=True)
        atomic_symlink(link, auto)


def is_digest(name: str) -> bool:
    """64 lowercase hex digits: an entry's name (anything else in objects/ is not one)."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _well_formed(meta: Any) -> bool:
    """The shape every reader relies on: outputs by name, each with sha256 and size."""
    if not isinstance(meta, dict) or not isinstance(meta.get("outputs"), dict):
        return False
    for name, rec in meta["outputs"].items():
        if not isinstance(name, str) or name.startswith("/") or ".." in name.split("/"):
            return False
        if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str):
            return False
        if "link" in rec and not (isinstance(rec["link"], str) and is_link_target(rec["link"])):
            return False
        if not all(isinstance(rec.get(k, 0), int) for k in ("size", *STAT_FIELDS)):
            return False
    return isinstance(meta.get("derivation", {}), dict)


def _seal(out: Path, known: dict[str, str]) -> dict[str, dict[str, Any]]:
    """fsync every file, make it read-only, and record its sha256 and stat.

    The stat is taken after the chmods, so a later check compares like with like. The
    fsyncs and the hashing run on a small thread pool (both release the GIL): the
    filesystem's journal commits concurrent fsyncs together, and a large output is hashed
    while the others are flushed.
    """
    from concurrent.futures import ThreadPoolExecutor

    files: dict[str, Path] = {}
    links: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(out):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink():
                target = os.readlink(p)
                if p.parent != out or not is_link_target(target):
                    raise StoreError(f"step output {p.relative_to(out)} is a symlink to "
                                     f"{target}; only ../<digest>/<output> links are kept.")
                links[name] = target
                continue
            os.chmod(p, 0o444 if not os.access(p, os.X_OK) else 0o555)
            files[p.relative_to(out).as_posix()] = p
    with ThreadPoolExecutor(max_workers=8) as pool:
        hashes = {rel: pool.submit(sha256_file, p) for rel, p in files.items()
                  if rel not in known}
        for done in [pool.submit(_fsync_file, p) for p in files.values()]:
            done.result()
        digests = {rel: known.get(rel) or hashes[rel].result() for rel in files}
    outputs: dict[str, dict[str, Any]] = {}
    for rel, p in files.items():
        outputs[rel] = {"sha256": digests[rel], **stat_record(p.stat())}
    for rel, target in links.items():
        outputs[rel] = {"link": target, "sha256": link_sha256(target), "size": 0}
    for dirpath, _, _ in os.walk(out, topdown=False):
        _fsync_dir(Path(dirpath))
        os.chmod(dirpath, 0o555)
    return outputs


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
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
