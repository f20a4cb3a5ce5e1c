"""store verify: re-hash every entry and name everything that is not as written.

Reports, by entry and file: ``changed`` (bytes differ from the record), ``missing``,
``symlink`` (an output replaced by a link), ``not-a-file``, ``mode`` (a file or folder not
read-only as sealed), ``stray`` (a file no record names: never used, but not ours),
``malformed`` (a record that is not JSON, lacks ``outputs``, or has wrong types),
``bad-link`` (a stack's link whose target is not an entry its derivation depends on, whose
record lists that output with the sha256 the link recorded: see store.entry.link_problem),
``foreign`` (an entry's name in ``objects/`` without a record that is not a plain folder,
such as a link out of the store), and ``unreadable``; and, as a ``leftover`` that is no damage, a
plain output folder without a record (a writer killed between its two renames: never
read, removed by the next build or gc). Never raises for what it finds in the store.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

from qwen38build.digest import sha256_file
from qwen38build.store.entry import _well_formed, is_digest, link_problem
from qwen38build.store.store import Store

LEFTOVER = "leftover"


def damage(found: list[Finding]) -> list[Finding]:
    """The findings that mean a committed entry is not as written (leftovers are not)."""
    return [f for f in found if f.kind != LEFTOVER]


@dataclass(frozen=True)
class Finding:
    kind: str
    entry: str
    path: str = ""
    detail: str = ""

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "entry": self.entry, "path": self.path,
                "detail": self.detail}

    def __str__(self) -> str:
        where = f"{self.entry}/{self.path}" if self.path else self.entry
        return f"{self.kind}: {where}" + (f" ({self.detail})" if self.detail else "")


def verify(store: Store) -> list[Finding]:
    found: list[Finding] = []
    if not store.objects.is_dir():
        return found
    try:
        names = sorted(os.listdir(store.objects))
    except OSError as exc:
        return [Finding("unreadable", str(store.objects), detail=str(exc))]
    records = {n.removesuffix(".json") for n in names if n.endswith(".json")}
    for name in names:
        if not name.endswith(".json") and name not in records:
            found.append(_unrecorded(store, name))
    for digest in sorted(records):
        try:
            found += _entry(store, digest)
        except OSError as exc:  # a folder we may not read: named, never a crash
            found.append(Finding("unreadable", digest, detail=str(exc)))
    return found


def _unrecorded(store: Store, name: str) -> Finding:
    """A name in objects/ without a record: a killed writer's folder, or something foreign."""
    p = store.objects / name
    if not is_digest(name):  # a writer's temp record (.<digest>.json.<pid>.<rand>.tmp)
        return Finding(LEFTOVER, name, detail="a temporary file of a writer; gc removes it")
    try:
        st = os.lstat(p)
    except OSError as exc:
        return Finding("unreadable", name, detail=str(exc))
    if stat.S_ISLNK(st.st_mode):
        return Finding("foreign", name, detail=f"a link to {os.readlink(p)}; the store makes "
                       "no linked folders, and a stack's link through it would leave the store")
    if not stat.S_ISDIR(st.st_mode):
        return Finding("foreign", name, detail="not a folder; the store never writes this")
    return Finding(LEFTOVER, name, detail="output folder without a record, "
                   "left by a killed build; the next build or gc removes it")


def _entry(store: Store, digest: str) -> list[Finding]:
    try:
        meta = json.loads(store.meta_path(digest).read_bytes())
    except (OSError, ValueError) as exc:
        return [Finding("malformed", digest + ".json", detail=str(exc))]
    if not _well_formed(meta):
        return [Finding("malformed", digest + ".json",
                        detail="no 'outputs' mapping of names to sha256, size and stat")]
    found: list[Finding] = []
    folder = store.objects / digest
    outputs = meta["outputs"]
    for name, rec in sorted(outputs.items()):
        p = folder / name
        if "link" in rec:
            why = link_problem(store.objects, digest, meta, name)
            if why is not None:
                found.append(Finding("bad-link", digest, name, why))
            continue
        try:
            st = os.lstat(p)
        except OSError:
            found.append(Finding("missing", digest, name))
            continue
        if stat.S_ISLNK(st.st_mode):
            found.append(Finding("symlink", digest, name, f"points at {os.readlink(p)}"))
            continue
        if not stat.S_ISREG(st.st_mode):
            found.append(Finding("not-a-file", digest, name))
            continue
        mode = stat.S_IMODE(st.st_mode)
        want = rec.get("mode")
        if (want is not None and mode != want) or mode not in (0o444, 0o555):
            found.append(Finding("mode", digest, name, f"{mode:o}, sealed read-only"))
        try:
            ok = sha256_file(p) == rec["sha256"]
        except OSError as exc:
            found.append(Finding("unreadable", digest, name, str(exc)))
            continue
        if not ok:
            found.append(Finding("changed", digest, name))
    if folder.is_dir() and not folder.is_symlink():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            dmode = stat.S_IMODE(os.lstat(dirpath).st_mode)
            if dmode != 0o555:
                rel = os.path.relpath(dirpath, folder).replace(os.sep, "/")
                found.append(Finding("mode", digest, "" if rel == "." else rel + "/",
                                     f"folder {dmode:o}, sealed 555"))
            for f in sorted(filenames + [d for d in dirnames
                                         if os.path.islink(os.path.join(dirpath, d))]):
                rel = os.path.relpath(os.path.join(dirpath, f), folder).replace(os.sep, "/")
                if rel not in outputs:
                    found.append(Finding("stray", digest, rel, "no record names it; never used"))
    elif outputs:
        found.append(Finding("missing", digest, detail="its output folder is not a folder"))
    return found
