"""A store entry: its outputs as recorded (sha256, size, mode, stat) and the checks on them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from qwen38build.digest import derivation_digest, sha256_bytes, sha256_file
from qwen38build.errors import StoreError
from qwen38build.files import (
    fsync_dir,
    fsync_file,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeGuard

    from qwen38build.store.records import Derivation, EntryRecord, OutputRecord


STAT_FIELDS = ("size", "mtime_ns", "ino", "ctime_ns")


def stat_record(st: os.stat_result, sha256: str) -> OutputRecord:
    """An output's record: its sha256 and the stat it has now."""
    return {"sha256": sha256, "size": st.st_size, "mode": stat.S_IMODE(st.st_mode),
            "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}


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


def link_ok(output: OutputRecord, path: str | Path) -> bool:
    """A link output still points where it was recorded to."""
    try:
        return bool(os.readlink(path) == output["link"])
    except (OSError, ValueError):
        return False


def link_problem(objects: str | Path, digest: str, meta: EntryRecord, name: str
                 ) -> str | None:
    """Why the link output ``name`` of entry ``digest`` (whose record is ``meta``) cannot be
    served, or None when it is sound. Checked by what it points at, not by its text alone:

    - it still reads as recorded, ``../<d>/<name>`` (its own name: a link never renames);
    - ``d`` is an entry the link's own derivation depends on, and that derivation hashes to
      ``digest``, so a record edited to point elsewhere (another entry's unpatched wheel)
      fails;
    - ``objects/<d>`` is a real folder (not a link out of the store) whose record lists
      ``name`` as a file with the sha256 this record holds for it (``target_sha256``), and
      ``objects/<d>/<name>`` is a regular file.

    The target's bytes are its own entry's check. Stdlib only: the no-op calls it.
    """
    rec = meta["outputs"][name]
    target = rec.get("link")
    if not isinstance(target, str) or not link_ok(rec, os.path.join(objects, digest, name)):
        return f"no longer a link to {target}"
    if not is_link_target(target) or target.split("/")[2] != name:
        return f"{target} is not ../<digest>/{name}"
    dep = target.split("/")[1]
    drv = meta.get("derivation")
    try:
        deps = {d for _, d in drv["deps"]} if isinstance(drv, dict) else set()
        own = isinstance(drv, dict) and derivation_digest(drv) == digest
    except (KeyError, TypeError, ValueError):
        deps, own = set(), False
    if not own:
        return "its record's derivation does not hash to its digest"
    if dep not in deps:
        return f"points at {dep[:12]}, which its derivation does not depend on"
    try:
        if not stat.S_ISDIR(os.lstat(os.path.join(objects, dep)).st_mode):
            return f"entry {dep[:12]} is not a folder of the store"
        with open(os.path.join(objects, f"{dep}.json"), "rb") as f:
            theirs = json.loads(f.read())
        st = os.lstat(os.path.join(objects, dep, name))
    except (OSError, ValueError) as exc:
        return f"its target is unreadable: {exc}"
    out = theirs.get("outputs") if isinstance(theirs, dict) else None
    got = out.get(name) if isinstance(out, dict) else None
    if not isinstance(got, dict) or "link" in got:
        return f"entry {dep[:12]}'s record lists no file {name}"
    if "target_sha256" not in rec or got.get("sha256") != rec["target_sha256"]:
        return f"entry {dep[:12]}'s record lists {name} with another sha256"
    if not stat.S_ISREG(st.st_mode):
        return f"{dep[:12]}/{name} is not a regular file"
    return None


def cheap_ok(output: OutputRecord, path: str | Path) -> bool:
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
    return (output["size"] == st.st_size and output.get("mtime_ns") in (None, st.st_mtime_ns)
            and output.get("ino") in (None, st.st_ino)
            and output.get("ctime_ns") in (None, st.st_ctime_ns))


# Outputs fully hashed by this process, by path: the stat they had when they matched.
_HASHED: dict[str, tuple[int, ...]] = {}


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


class Entry:
    """A committed store entry: where its files are and what they were when written."""

    __slots__ = ("digest", "meta", "path")

    def __init__(self, digest: str, path: Path, meta: EntryRecord) -> None:
        self.digest = digest
        self.path = path
        self.meta = meta

    @property
    def outputs(self) -> dict[str, OutputRecord]:
        return self.meta["outputs"]

    @property
    def derivation(self) -> Derivation:
        return self.meta["derivation"]

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

    def link_sound(self, name: str) -> bool:
        return link_problem(self.path.parent, self.digest, self.meta, name) is None

    def cheap_ok(self) -> bool:
        """Every output has its sealed stat; every link is sound (see link_problem)."""
        return all(self.link_sound(n) if "link" in rec else cheap_ok(rec, self.path / n)
                   for n, rec in self.outputs.items())

    def bad_outputs(self, only: str | None = None) -> list[str]:
        """Outputs (or just ``only``) whose bytes are not their recorded sha256 (a link:
        not sound); each file is hashed once per stat by this process."""
        bad = []
        for name, rec in self.outputs.items():
            if only is not None and name != only:
                continue
            p = self.path / name
            if "link" in rec:
                if not self.link_sound(name):
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


def is_digest(name: str) -> bool:
    """64 lowercase hex digits: an entry's name (anything else in objects/ is not one)."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _well_formed(meta: object) -> TypeGuard[EntryRecord]:
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


def _seal(out: Path, known: dict[str, str]) -> dict[str, OutputRecord]:
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
        for done in [pool.submit(fsync_file, p) for p in files.values()]:
            done.result()
        digests = {rel: known.get(rel) or hashes[rel].result() for rel in files}
    outputs: dict[str, OutputRecord] = {}
    for rel, p in files.items():
        outputs[rel] = stat_record(p.stat(), digests[rel])
    for rel, target in links.items():
        outputs[rel] = {"link": target, "sha256": link_sha256(target), "size": 0}
    for dirpath, _, _ in os.walk(out, topdown=False):
        fsync_dir(Path(dirpath))
        os.chmod(dirpath, 0o555)
    return outputs
