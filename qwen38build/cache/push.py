"""Push: upload builds' closures to a binary cache, signed, atomic for readers, idempotent.

For each step entry of a closure (dependencies first): if the cache already has
``<digest>.json`` nothing is sent; otherwise every output is PUT under ``<digest>/``, each
re-hashed while sent and checked against the store's record (a changed local file is never
published), and then the signed record is PUT last. A reader asks for the record first, so
it sees either no entry or a complete one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qwen38build.cache import record as cacherecord
from qwen38build.cache import transport as cachehttp
from qwen38build.errors import StoreError

if TYPE_CHECKING:
    from qwen38build.cache.signing import SecretKey
    from qwen38build.cache.transport import Readable
    from qwen38build.engine.report import Reporter
    from qwen38build.store.entry import Entry
    from qwen38build.store.store import Store


@dataclass
class PushResult:
    sent: list[str] = field(default_factory=list)  # digests uploaded now
    present: list[str] = field(default_factory=list)  # digests the cache already had
    bytes_sent: int = 0


def closure_digests(store: Store, builds: list[str]) -> list[str]:
    """Every step digest of the recorded builds, dependencies first, each once."""
    from qwen38build.store.record import read_build

    out: list[str] = []
    for build in builds:
        for step in read_build(store, build)["steps"]:
            if step["digest"] not in out:
                out.append(step["digest"])
    return out


class _HashingReader:
    """A file, hashed as http.client reads it for the request body."""

    def __init__(self, f: Readable) -> None:
        self.f = f
        self.h = hashlib.sha256()

    def read(self, n: int = -1, /) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def push(store: Store, url: str, digests: list[str], key: SecretKey, *, timeout: float,
         reporter: Reporter) -> PushResult:
    result = PushResult()
    for digest in digests:
        entry = store.get(digest)
        if entry is None and not store.meta_path(digest).exists():
            # A build input of a step this store substituted: never here, not needed.
            reporter.line(f"not pushed: {digest[:12]} is a build input this store never had")
            continue
        if entry is None:
            raise StoreError(f"step {digest[:12]} of the closure is not in the store {store.root}"
                             " (or changed since written); nothing of it was pushed.",
                             hint="build it again, then push")
        if any("link" in rec for rec in entry.outputs.values()):
            # A stack holds only links to its parts' entries, each pushed on its own: a
            # machine that substitutes the parts makes the links itself in milliseconds.
            reporter.line(f"not pushed: {digest[:12]} holds links only (a stack)")
            continue
        if cachehttp.exists(cachehttp.join(url, f"{digest}.json"), timeout) is not None:
            result.present.append(digest)
            continue
        result.bytes_sent += _upload(entry, url, key, timeout, reporter)
        result.sent.append(digest)
    return result


def _upload(entry: Entry, url: str, key: SecretKey, timeout: float, reporter: Reporter) -> int:
    sent = 0
    name_of = entry.meta["derivation"].get("name", entry.digest[:12])
    for name, rec in sorted(entry.outputs.items()):
        path = entry.file(name)
        if rec["size"] >= 32 << 20:
            reporter.line(f"push {name_of}: {name} ({rec['size'] / 1e6:.0f} MB)")
        with path.open("rb") as f:
            body = _HashingReader(f)
            cachehttp.put(cachehttp.join(url, entry.digest, name), body, rec["size"], timeout)
        if body.h.hexdigest() != rec["sha256"]:
            raise StoreError(
                f"{path}: changed since the store wrote it (sha256 differs); the entry's record "
                "was not pushed, so no reader will use what was sent.",
                hint="run `qwen38build store verify`, rebuild, then push again")
        sent += rec["size"]
    record = cacherecord.make(entry, key)
    cachehttp.put(cachehttp.join(url, f"{entry.digest}.json"), record, len(record), timeout)
    reporter.line(f"pushed {name_of} ({entry.digest[:12]})")
    return sent + len(record)
