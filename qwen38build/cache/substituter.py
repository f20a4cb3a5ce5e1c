"""Substitution: take a step's output from a binary cache instead of building it.

For a step's digest, each configured cache is asked in order for ``<digest>.json``. A
record is used only after :func:`qwen38build.cache.record.check` passes (signed by a
trusted key, for this digest); then every output is downloaded into the store's temp
entry, hashed while written, and must have exactly its signed size and sha256. Only then
is the entry committed through :meth:`Store.add`, as if built. Anything less and the temp
entry is dropped: a poisoned entry never enters the store.

A cache is never needed. One that is down, slow, erroring or cutting downloads short is
reported in one warning line and not asked again in this run; an entry that fails a check
is reported and skipped. Either way the step is built locally.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from qwen38build.cache import record as cacherecord
from qwen38build.cache import transport as cachehttp
from qwen38build.errors import CacheError, UntrustedEntry

if TYPE_CHECKING:
    from qwen38build.cache.config import CacheConfig
    from qwen38build.cache.record import CacheRecord, Output
    from qwen38build.engine.report import Reporter
    from qwen38build.engine.step import Step
    from qwen38build.store.entry import Entry
    from qwen38build.store.store import Store

BIG = 32 << 20  # downloads at least this large report their progress


class Substituters:
    """The caches of one run, and which of them have failed in it."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.urls = list(config.active)
        self.down: set[str] = set()
        self.warned_no_keys = False

    def substitute(self, step: Step, store: Store, reporter: Reporter) -> Entry | None:
        """Commit ``step``'s entry from the first cache that has a good one; None: build it."""
        urls = [u for u in self.urls if u not in self.down]
        if not urls:
            return None
        if not self.config.trusted_keys:
            if not self.warned_no_keys:
                reporter.line("warning: substituters are configured but no trusted public key; "
                              "no cache entry can be used (set trusted-public-keys)")
                self.warned_no_keys = True
            return None
        for url in urls:
            try:
                record = self._record(url, step)
                if record is None:
                    continue
                entry = self._commit(url, step, record, store, reporter)
            except UntrustedEntry as exc:
                reporter.line(f"warning: cache {url}: entry {step.short} ({step.name}) "
                              f"refused: {exc}; not used")
                continue
            except CacheError as exc:
                self.down.add(url)
                reporter.line(f"warning: cache {url} is unusable ({exc}); going on without it")
                continue
            reporter.note(step, f"substituted from {url} (signed by {record.signer})")
            return entry
        return None

    def _record(self, url: str, step: Step) -> CacheRecord | None:
        data = cachehttp.read_all(cachehttp.join(url, f"{step.digest}.json"),
                                  self.config.timeout, cacherecord.MAX_RECORD)
        if data is None:
            return None
        return cacherecord.check(data, step.digest, list(self.config.trusted_keys))

    def _commit(self, url: str, step: Step, record: CacheRecord, store: Store,
                reporter: Reporter) -> Entry:
        def fill(out: Path) -> dict[str, str]:
            for o in record.outputs:
                dest = out / o.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                self._download(cachehttp.join(url, step.digest, o.name), o, dest, step,
                               reporter)
            return {o.name: o.sha256 for o in record.outputs}

        old_umask = os.umask(0o022)  # modes as a local build makes them
        try:
            return store.add(step.digest, step.derivation(), fill)
        finally:
            os.umask(old_umask)

    def _download(self, url: str, o: Output, dest: Path, step: Step,
                  reporter: Reporter) -> None:
        h = hashlib.sha256()
        marks = [o.size * k // 4 for k in (1, 2, 3)] if o.size >= BIG else []
        if marks:
            reporter.note(step, f"downloading {o.name} ({o.size / 1e6:.0f} MB)")
        done = 0
        # sha256 runs on its own thread, a block behind: hashing a block overlaps writing
        # it and receiving the next (both release the GIL), so the hash costs no time.
        hashing: Future[None] | None = None
        with (cachehttp.get(url, self.config.timeout, o.size) as resp, dest.open("wb") as f,
              ThreadPoolExecutor(max_workers=1) as hasher):
            if resp is None:
                raise CacheError(f"{url}: missing, though its signed record lists it")

            def sink(block: memoryview) -> None:
                nonlocal done, hashing
                if hashing is not None:
                    hashing.result()
                hashing = hasher.submit(h.update, block)
                f.write(block)
                done += len(block)
                while marks and done >= marks[0]:
                    marks.pop(0)
                    reporter.note(step, f"{o.name}: {100 * done // o.size}% of "
                                  f"{o.size / 1e6:.0f} MB")

            got = cachehttp.copy_to(resp, url, sink, o.size)
            if hashing is not None:
                hashing.result()
        if got < o.size:
            raise CacheError(f"{url}: cut short at {got} of {o.size} bytes")
        if got > o.size or h.hexdigest() != o.sha256:
            raise UntrustedEntry(f"output {o.name} does not match its signed size and sha256")
        if o.executable:
            dest.chmod(0o755)
