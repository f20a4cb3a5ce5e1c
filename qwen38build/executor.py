"""Realise steps: a store hit, or run the step's kind and commit its output.

Each step is built under its digest's file lock, so concurrent builds run a step once and
the others find it in the store. A step whose committed output changed on disk (found by
stat) is removed and rebuilt, never used.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from qwen38build.digest import sha256_file
from qwen38build.errors import InputError, StoreError
from qwen38build.report import Reporter
from qwen38build.step import Step, walk
from qwen38build.store import Entry, Store

if TYPE_CHECKING:
    from qwen38build.substituter import Substituters

KINDS = {
    "fetch": "qwen38build.steps.fetch",
    "patch": "qwen38build.steps.patch",
    "wheel": "qwen38build.steps.wheel",
    "cubin": "qwen38build.steps.cubin",
    "pthfa-wheel": "qwen38build.steps.pthfa_wheel",
}


def kind_module(kind: str) -> ModuleType:
    try:
        return importlib.import_module(KINDS[kind])
    except KeyError:
        raise InputError(f"unknown step kind {kind!r}.") from None


def kind_version(kind: str) -> int:
    version: int = kind_module(kind).VERSION
    return version


@dataclass
class Context:
    """What a step's ``run`` may use: its step, an empty output dir, scratch space."""

    step: Step
    out: Path
    scratch: Path
    store: Store
    reporter: Reporter
    source_stores: list[Store] = field(default_factory=list)
    source_dirs: list[Path] = field(default_factory=list)
    # sha256 of output files the step hashed while writing them, by relative path.
    hashed: dict[str, str] = field(default_factory=dict)

    def report(self, message: str) -> None:
        self.reporter.note(self.step, message)

    def input_path(self, name: str) -> Path:
        """The input file ``name``, checked against the sha256 its digest used."""
        want = dict(self.step.inputs)[name]
        path = self.step.input_paths.get(name)
        if path is None:
            for st in (self.store, *self.source_stores):
                path = st.source(want)
                if path is not None:
                    break
        if path is None:
            raise StoreError(f"input {name} (sha256 {want[:12]}) of {self.step.name} is gone.")
        if sha256_file(path) != want:
            raise InputError(
                f"{path}: changed while the build ran (sha256 no longer {want[:12]}).",
                hint="run the build again",
            )
        return path

    def dep_entry(self, name: str) -> Entry:
        dep = self.step.dep(name)
        entry = self.store.get(dep.digest)
        if entry is None:
            raise StoreError(f"{dep.name} ({dep.short}) vanished from the store mid-build.")
        return entry

    def source_candidates(self, sha256: str, filename: str) -> Iterable[Path]:
        """Files that may hold a fixed output already; each is checked while copied."""
        for st in (self.store, *self.source_stores):
            entry = st.lookup(self.step.digest)
            if entry is not None and (entry.path / filename).is_file():
                yield entry.path / filename
        env_dirs = filter(None, os.environ.get("QWEN38BUILD_SOURCES", "").split(os.pathsep))
        for d in (*self.source_dirs, *map(Path, env_dirs)):
            p = d / filename
            if p.is_file():
                yield p


@dataclass(frozen=True)
class Outcome:
    step: Step
    entry: Entry
    built: bool  # False: it was a store hit
    seconds: float


def realise(
    tops: list[Step],
    store: Store,
    reporter: Reporter,
    *,
    source_stores: list[Store] | None = None,
    source_dirs: list[Path] | None = None,
    on_done: Callable[[Outcome], None] | None = None,
    substituters: Substituters | None = None,
) -> dict[str, Outcome]:
    """Make every step of the closure of ``tops`` present in ``store``; by digest.

    A step missing from the store is first asked of ``substituters`` (verified there
    before it is committed), then built.
    """
    steps = list(walk(tops))
    outcomes: dict[str, Outcome] = {}
    reporter.start(len(steps))
    for index, step in enumerate(steps, 1):
        t0 = time.perf_counter()
        entry = store.get(step.digest)
        built = False
        if entry is None:
            reporter.step_start(step, index, len(steps))
            with store.lock(step.digest):
                entry = store.get(step.digest)  # another build may have made it meanwhile
                if entry is None:
                    if store.lookup(step.digest) is not None:
                        reporter.note(step, "its store entry changed since written; rebuilding")
                        store.remove(step.digest)
                    if substituters is not None:
                        entry = substituters.substitute(step, store, reporter)
                    if entry is None:
                        entry = _build(step, store, reporter, source_stores or [],
                                       source_dirs or [])
                        built = True
        outcome = Outcome(step, entry, built, time.perf_counter() - t0)
        outcomes[step.digest] = outcome
        reporter.step_done(step, index, len(steps), built=built, seconds=outcome.seconds)
        if on_done:
            on_done(outcome)
    reporter.finish()
    return outcomes


def _build(
    step: Step, store: Store, reporter: Reporter, source_stores: list[Store],
    source_dirs: list[Path],
) -> Entry:
    module = kind_module(step.kind)
    store.tmp.mkdir(parents=True, exist_ok=True)
    old_umask = os.umask(0o022)  # outputs' modes must not depend on the caller's umask
    try:
        with tempfile.TemporaryDirectory(prefix="scratch.", dir=store.tmp) as scratch:

            def fill(out: Path) -> dict[str, str]:
                ctx = Context(step, out, Path(scratch), store, reporter, source_stores,
                              source_dirs)
                module.run(ctx)
                return ctx.hashed

            return store.add(step.digest, step.derivation(), fill)
    finally:
        os.umask(old_umask)
