"""gc: remove store entries that nothing alive reaches.

Kept: the closure of every root. Roots are the named roots (``roots/*.json``: the last build
of each recipe), the indirect roots (``gcroots/auto/*``: links to projects' ``result``
links, followed as Nix follows gcroots/auto; one whose link is gone or points elsewhere is
dropped), and the temporary roots of every live session (temproots.py). gc decides and
deletes under ``gc.lock`` held exclusively, so a build's roots are either all seen or not yet
taken, in which case the build has not looked anything up yet. A malformed root stops gc
before it removes anything (exit 1): what it rooted cannot be told, so nothing may be taken
as unrooted. Malformed records are reported, never fatal; an entry whose record cannot be
read is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from qwen38build.errors import StoreError
from qwen38build.files import remove_tree
from qwen38build.store import temproots
from qwen38build.store.entry import is_digest
from qwen38build.store.record import roots
from qwen38build.store.store import Store


@dataclass(frozen=True)
class Freed:
    """One thing gc removed (or, dry, would remove): what it was and its bytes on disk."""

    path: str  # a digest, or a tmp/ folder's name
    kind: str  # the step's kind; "" for an entry with no readable record, "tmp" for tmp/
    name: str  # the step's derivation name; "" when unknown
    size: int

    def as_json(self) -> dict[str, object]:
        return {"path": self.path, "kind": self.kind, "name": self.name, "bytes": self.size}


@dataclass
class Report:
    removed: list[str] = field(default_factory=list)
    tmp_removed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    freed: list[Freed] = field(default_factory=list)  # removed and tmp_removed, described

    @property
    def total(self) -> int:
        return sum(f.size for f in self.freed)


def _rooted_builds(store: Store, report: Report, *, prune: bool) -> set[str]:
    """Digests the named and indirect roots point at."""
    for folder in (store.roots, store.auto_roots):
        if os.path.lexists(folder) and not folder.is_dir():  # unreadable roots: keep all
            raise StoreError(f"{folder}: the store's roots are not a folder here; gc removed "
                             "nothing, as it cannot tell what they keep.",
                             hint="move that file away (roots are folders of small files)")
    bad: list[str] = []
    named = roots(store, bad)
    bad += [f"{store.roots / name}.json: malformed root (build {b[:80]!r} is not a build hash)"
            for name, b in sorted(named.items()) if not is_digest(b)]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise StoreError(f"{bad[0].removesuffix('; ignored')}{more}; gc removed nothing, as it "
                         "cannot tell what that root keeps.",
                         hint="fix or remove the root file (a build of its recipe writes it "
                         "again), then run gc again")
    out = set(named.values())
    if store.auto_roots.is_dir():
        objects = os.path.realpath(store.objects)
        for auto in sorted(store.auto_roots.iterdir()):
            target = None
            with contextlib.suppress(OSError):
                link = os.readlink(auto)
                target = os.path.realpath(link) if os.path.islink(link) else None
            if target is not None and os.path.dirname(target) == objects:
                out.add(os.path.basename(target))
            elif prune:  # the result link is gone or points elsewhere: no longer a root
                with contextlib.suppress(FileNotFoundError):
                    auto.unlink()
    return out


def _closure(store: Store, tops: set[str], report: Report) -> set[str]:
    """``tops`` and every digest their recorded derivations depend on."""
    live: set[str] = set()
    todo = list(tops)
    while todo:
        digest = todo.pop()
        if digest in live or not is_digest(digest):
            continue  # a name that is no digest never reaches a path
        live.add(digest)
        try:
            meta = json.loads(store.meta_path(digest).read_bytes())
            deps = [d for _, d in meta["derivation"]["deps"]]
        except FileNotFoundError:
            deps = _recorded_steps(store, digest)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            report.problems.append(f"{store.meta_path(digest)}: malformed record ({exc}); "
                                   "kept")
            deps = []
        todo.extend(d for d in deps if isinstance(d, str))
    return live


def _recorded_steps(store: Store, build: str) -> list[str]:
    """A build whose top entry is gone still keeps what its record lists."""
    try:
        steps = json.loads((store.builds / f"{build}.json").read_bytes())["steps"]
        return [s["digest"] for s in steps]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _stored(store: Store) -> set[str]:
    """Every digest with a record or an output folder (an orphan of a crash)."""
    if not store.objects.is_dir():
        return set()
    names = (p.name.removesuffix(".json") for p in store.objects.iterdir())
    return {n for n in names if is_digest(n)}  # never another writer's temp file


def collect(store: Store, *, dry_run: bool = False) -> Report:
    """Remove what nothing alive reaches. The exclusive lock is held only to decide and to
    move dead entries into gc's own ``tmp/`` space (renames); they are deleted after."""
    report = Report()
    if not store.root.is_dir():
        return report
    with store.hold() as session:  # made before the exclusive lock: it takes a shared one
        trash: list[Path] = []
        with store.gc_lock():
            # Sessions first, roots second. A build writes its root and only then releases
            # its temporary roots, neither under this lock: read in this order, whatever it
            # does between the two reads, one of them shows what it made. (The other order
            # missed a build finishing in between: its root not yet there, its session gone.)
            tops: set[str] = set()
            for digests in temproots.live_sessions(store.root).values():
                tops |= digests
            tops |= _rooted_builds(store, report, prune=not dry_run)
            live = _closure(store, tops, report)
            report.removed = sorted(_stored(store) - live)
            described = {d: _describe(store, d) for d in report.removed}
            if dry_run:
                report.freed = list(described.values())
                return report
            gone: list[str] = []
            for digest in report.removed:
                try:
                    trash += _unlink_entry(store, session, digest)
                    gone.append(digest)
                except OSError as exc:
                    report.problems.append(f"{store.objects / digest}: not removed ({exc})")
            report.removed = gone
            report.freed = [described[d] for d in gone]
            dead = temproots.dead_tmp(store.root, store.tmp)
        for p in trash + dead:
            size = _bytes(p) if p in dead else 0
            try:
                remove_tree(p)
            except OSError as exc:
                report.problems.append(f"{p}: not removed ({exc})")
                continue
            if p in dead:
                report.tmp_removed.append(p.name)
                report.freed.append(Freed(p.name, "tmp", "", size))
        temproots.drop_stale_locks(store.locks)
    return report


def _bytes(path: Path) -> int:
    """Bytes of the files under ``path``, links not followed (a link counts as itself)."""
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            return os.lstat(path).st_size
        except OSError:
            return 0
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _describe(store: Store, digest: str) -> Freed:
    """What ``digest`` is (its record's kind and name, when readable) and its bytes."""
    kind = name = ""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        drv = json.loads(store.meta_path(digest).read_bytes())["derivation"]
        kind, name = str(drv.get("kind", "")), str(drv.get("name", ""))
    size = _bytes(store.objects / digest) + _bytes(store.meta_path(digest))
    return Freed(digest, kind, name, size)


def _unlink_entry(store: Store, session: temproots.Session, digest: str) -> list[Path]:
    """Drop ``digest``'s record, then move its folder into gc's tmp space (a rename)."""
    with contextlib.suppress(FileNotFoundError):
        store.meta_path(digest).unlink()
    folder = store.objects / digest
    if not (folder.exists() or folder.is_symlink()):
        return []
    store.tmp.mkdir(parents=True, exist_ok=True)
    moved = store.tmp / f"{session.id}.gc.{digest[:12]}.{os.urandom(4).hex()}"
    if not folder.is_symlink():
        os.chmod(folder, 0o755)  # moving a folder to another parent rewrites its ".."
    folder.rename(moved)
    return [moved]


def live_digests(store: Store) -> set[str]:
    """Every digest gc would keep now (for tests and ``why``)."""
    report = Report()
    with store.gc_lock():
        tops = _rooted_builds(store, report, prune=False)
        for digests in temproots.live_sessions(store.root).values():
            tops |= digests
        return _closure(store, tops, report)
