"""The content-addressed store: one read-only entry per step digest, written atomically.

Layout under the store root::

    objects/<digest>/        the step's output files (read-only)
    objects/<digest>.json    its derivation and the size, mtime and sha256 of each output
                             file; written last, so its presence is the commit marker
    sources/<sha256>         input files (patches) by content, for reproduce
    builds/<hash>.json       the closure of one build, enough to reproduce it
    roots/<name>.json        gc roots: the last build of each recipe
    tmp/  locks/             work in progress and per-digest file locks

An entry is written into ``tmp/``, fsynced, then renamed into place, metadata last. A crash
at any point leaves at most an orphan directory that the next writer removes. A hit is
checked by stat (size and mtime of every file) so a later change is noticed without
re-hashing; ``verify`` re-hashes everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

from qwen38build.digest import sha256_file, tree_digest
from qwen38build.errors import StoreError

# The no-op build imports this module (for default_root): typing, dataclasses, shutil and
# tempfile would cost more than the rest of it, so they stay out of its import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

ENV_STORE = "QWEN38BUILD_STORE"


def default_root() -> Path:
    """``$QWEN38BUILD_STORE``, else ``<user cache dir>/qwen38build/store``."""
    env = os.environ.get(ENV_STORE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qwen38build" / "store"


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


class Store:
    """A store rooted at ``root``; created on first write, never written outside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.sources = root / "sources"
        self.builds = root / "builds"
        self.roots = root / "roots"
        self.tmp = root / "tmp"
        self.locks = root / "locks"

    # -- reading -------------------------------------------------------------------------

    def meta_path(self, digest: str) -> Path:
        return self.objects / f"{digest}.json"

    def get(self, digest: str) -> Entry | None:
        """The entry for ``digest`` if it is committed and unchanged since written, else None."""
        entry = self.lookup(digest)
        if entry is None or self.changed_files(entry, rehash=False):
            return None
        return entry

    def lookup(self, digest: str) -> Entry | None:
        """The committed entry for ``digest``, unchecked."""
        try:
            meta = json.loads(self.meta_path(digest).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StoreError(
                f"{self.meta_path(digest)}: unreadable store metadata: {exc}."
            ) from exc
        return Entry(digest, self.objects / digest, meta)

    def changed_files(self, entry: Entry, *, rehash: bool) -> list[str]:
        """Names of output files that differ from what was written (by stat, or by hash)."""
        bad = []
        for name, rec in entry.outputs.items():
            p = entry.path / name
            try:
                st = p.stat()
            except FileNotFoundError:
                bad.append(name)
                continue
            moved = st.st_size != rec["size"] or (
                sha256_file(p) != rec["sha256"] if rehash else st.st_mtime_ns != rec["mtime_ns"]
            )
            if moved:
                bad.append(name)
        return bad

    def entries(self) -> Iterator[str]:
        if not self.objects.is_dir():
            return
        for p in sorted(self.objects.glob("*.json")):
            yield p.stem

    # -- writing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, digest: str) -> Iterator[None]:
        """Hold the per-digest lock: one process realises a given step at a time."""
        from filelock import FileLock

        self.locks.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.locks / f"{digest}.lock")):
            yield

    def add(
        self, digest: str, derivation: dict[str, Any],
        fill: Callable[[Path], dict[str, str] | None],
    ) -> Entry:
        """Run ``fill(out_dir)`` in a temp dir and commit its files as entry ``digest``.

        ``fill`` may return the sha256 of output files it hashed while writing them (by
        relative path), so a large file is not read twice. Refuses to overwrite a committed
        entry. If ``fill`` raises, nothing is stored.
        """
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.objects.mkdir(parents=True, exist_ok=True)
        import tempfile

        work = Path(tempfile.mkdtemp(prefix=f"{digest[:12]}.", dir=self.tmp))
        try:
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
            if final.exists():  # an orphan from a crash before its metadata landed
                remove_tree(final)
            out.rename(final)
            _fsync_dir(self.objects)
            meta_tmp.rename(self.meta_path(digest))
            _fsync_dir(self.objects)
            # mtimes recorded above are preserved by rename; stat them again to be sure.
            return Entry(digest, final, meta)
        finally:
            if work.exists():
                remove_tree(work)

    def remove(self, digest: str) -> None:
        """Drop an entry (gc, or a corrupt entry about to be rebuilt); metadata first."""
        with contextlib.suppress(FileNotFoundError):
            self.meta_path(digest).unlink()
        final = self.objects / digest
        if final.exists():
            remove_tree(final)

    def add_source(self, path: Path) -> str:
        """Keep an input file by content; returns its sha256. Idempotent."""
        digest = sha256_file(path)
        dest = self.sources / digest
        if not dest.exists():
            self.sources.mkdir(parents=True, exist_ok=True)
            tmp = self.sources / f".{digest}.{os.getpid()}.tmp"
            import shutil

            shutil.copyfile(path, tmp)
            os.chmod(tmp, 0o444)
            _fsync_file(tmp)
            tmp.replace(dest)
        return digest

    def source(self, sha256: str) -> Path | None:
        p = self.sources / sha256
        return p if p.exists() else None

    def write_json(self, path: Path, value: Any) -> None:
        """Atomically (re)write a small JSON file of the store (build records, roots)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        _write_synced(tmp, json.dumps(value, indent=1, sort_keys=True).encode())
        tmp.replace(path)

    def clean_tmp(self) -> None:
        """Remove leftovers of killed writers (nothing in tmp/ is ever committed)."""
        if self.tmp.is_dir():
            for p in self.tmp.iterdir():
                remove_tree(p)


def _seal(out: Path, known: dict[str, str]) -> dict[str, dict[str, Any]]:
    """fsync every file, make it read-only, and record size, mtime and sha256.

    The fsyncs and the hashing run on a small thread pool (both release the GIL): the
    filesystem's journal commits concurrent fsyncs together, and a large output is hashed
    while the others are flushed.
    """
    from concurrent.futures import ThreadPoolExecutor

    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(out):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink():
                raise StoreError(f"step output {p.relative_to(out)} is a symlink; refused.")
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
        st = p.stat()
        outputs[rel] = {"sha256": digests[rel], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
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
