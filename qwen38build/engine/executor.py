"""Realise steps: a store hit, or run the step's kind and commit its output.

Every digest of the closure is made a temporary root before it is looked up, so gc leaves
it alone. Each step is built under its digest's lock, so concurrent builds run a step once
and the others find it in the store. A committed output whose stat moved is re-hashed: kept
if its bytes hold, else removed and rebuilt. The outputs of dependencies a step used are
fully re-hashed before its own output is committed; if one changed, it is removed, rebuilt
(or refetched) and the step runs again, so bad bytes are never passed on.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from qwen38build.digest import sha256_file
from qwen38build.engine.report import Reporter
from qwen38build.engine.step import Step, walk
from qwen38build.errors import InputError, StoreError
from qwen38build.files import remove_tree
from qwen38build.inputs.env import source_dirs
from qwen38build.steps import kind_module, runtime_deps
from qwen38build.store.entry import CorruptEntry, Entry
from qwen38build.store.store import Store

if TYPE_CHECKING:
    from qwen38build.cache.substituter import Substituters

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
    # dependencies' entries the step read, each being re-hashed on a thread while the step
    # runs (hashlib releases the GIL); checked before the step's output is committed.
    used: dict[str, _Check] = field(default_factory=dict)

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
        """A dependency's entry; its outputs are re-hashed before this step commits."""
        dep = self.step.dep(name)
        entry = self.store.get(dep.digest)
        if entry is None:
            raise CorruptEntry(dep.digest, ["its outputs"])
        if dep.digest not in self.used:
            self.used[dep.digest] = _Check(entry)
        return entry

    def check_used(self) -> None:
        """Raise CorruptEntry if any dependency output read by the step changed."""
        for digest, check in self.used.items():
            bad = check.result()
            if bad:
                raise CorruptEntry(digest, bad)

    def source_candidates(self, sha256: str, filename: str) -> Iterable[Path]:
        """Files that may hold a fixed output already; each is checked while copied.

        Any entry of a known store recording an output ``filename`` with this sha256 will
        do (a fixed output is its bytes, whichever step fetched it), then source folders.
        """
        for st in (self.store, *self.source_stores):
            yield from _outputs_named(st, filename, sha256)
        for d in (*self.source_dirs, *source_dirs()):
            p = d / filename
            if p.is_file():
                yield p


class _Check:
    """An entry's full re-hash, started now on a daemon thread (a failed step's exit does
    not wait for it)."""

    def __init__(self, entry: Entry) -> None:
        self._bad: list[str] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(entry,), daemon=True)
        self._thread.start()

    def _run(self, entry: Entry) -> None:
        try:
            self._bad = entry.bad_outputs()
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self) -> list[str]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._bad or []


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
    jobs: int = 1,
) -> dict[str, Outcome]:
    """Make every step of the closure of ``tops`` present in ``store``; by digest.

    A step missing from the store is first asked of ``substituters`` (verified there
    before it is committed), then built. Up to ``jobs`` steps run at once, each as soon as
    the steps it depends on are done (the cubins of every arch side by side).
    """
    check_locked_sizes(tops, store)
    # Outputs' modes must not depend on the caller's umask. It is the process's: set once
    # for the whole call, not per step, so steps running side by side all see 022.
    old_umask = os.umask(0o022)
    try:
        return _realise(tops, store, reporter, source_stores, source_dirs, on_done,
                        substituters, jobs)
    finally:
        os.umask(old_umask)


def check_locked_sizes(tops: list[Step], store: Store) -> None:
    """A fixed output already in the store has the size its lock entry gives, or the lock
    is bad input (LockError, before any step runs). Its digest is the file name and sha256
    alone, so a wrong size would otherwise pass unseen while the entry is kept."""
    from qwen38build.errors import LockError

    for step in walk(tops):
        size = step.hints.get("size")
        if step.kind != "fetch" or type(size) is not int:
            continue
        entry = store.lookup(step.digest)
        name = str(step.params["filename"])
        out = entry.outputs.get(name) if entry is not None else None
        got = out["size"] if out is not None else None
        if type(got) is int and got != size:
            raise LockError(f"lock/sources.json: {name}: size {size}, but the file of its "
                            f"sha256 is {got} bytes.",
                            hint="fix the size (or re-run `qwen38build lock`)")


def _needed(tops: list[Step], store: Store, reporter: Reporter,
            substituters: Substituters) -> list[Step]:
    """The steps to realise, found top-down as Nix substitutes: a step present here, or
    substituted now, needs none of its build inputs, only its runtime references (a stack's
    parts); a step that must be built needs every dependency. Dependencies first."""
    order: list[Step] = []
    seen: set[str] = set()

    def visit(step: Step) -> None:
        if step.digest in seen:
            return
        seen.add(step.digest)
        present = store.get(step.digest) is not None
        if not present:
            with store.lock(step.digest):
                present = (store.trusted(step.digest) is not None
                           or substituters.substitute(step, store, reporter) is not None)
        for dep in runtime_deps(step) if present else [d for _, d in step.deps]:
            visit(dep)
        order.append(step)

    for top in tops:
        visit(top)
    return order


def _realise(
    tops: list[Step], store: Store, reporter: Reporter, source_stores: list[Store] | None,
    source_dirs: list[Path] | None, on_done: Callable[[Outcome], None] | None,
    substituters: Substituters | None, jobs: int,
) -> dict[str, Outcome]:
    steps = list(walk(tops))
    with store.hold() as session:
        session.add(s.digest for s in steps)  # roots first, then look: gc keeps them
        if not session.cleaned:
            session.cleaned = True
            store.clean_tmp()  # a killed build's temp space goes with the next build
        if substituters is not None:
            steps = _needed(tops, store, reporter, substituters)
            substituters = None  # every step left was asked once already: build it
        reporter.start(len(steps))
        outcomes: dict[str, Outcome] = {}
        index = {s.digest: i for i, s in enumerate(steps, 1)}

        def one(step: Step) -> Outcome:
            return _realise_one(step, index[step.digest], len(steps), store, reporter,
                                source_stores or [], source_dirs or [], substituters)

        for attempt in range(1, RETRIES + 1):
            try:
                _schedule(steps, outcomes, one, on_done, jobs)
                break
            except CorruptEntry as exc:
                if attempt == RETRIES:
                    raise
                with store.lock(exc.digest):
                    store.drop_if_bad(exc.digest)  # unless another build replaced it
                # the corrupt entry and whatever was made from it are made again
                stale = {exc.digest} | {s.digest for s in steps if exc.digest in _closure(s)}
                for digest in stale:
                    outcomes.pop(digest, None)
        reporter.finish()
        return outcomes


RETRIES = 3


def _schedule(
    steps: list[Step], outcomes: dict[str, Outcome], one: Callable[[Step], Outcome],
    on_done: Callable[[Outcome], None] | None, jobs: int,
) -> None:
    """Realise ``steps`` (dependencies first) not yet in ``outcomes``, ``jobs`` at a time,
    each once its dependencies are done. A failure lets the running steps finish (each
    commits whole or not at all), starts no other, and is raised."""
    todo = [s for s in steps if s.digest not in outcomes]
    if jobs <= 1:
        for step in todo:
            outcomes[step.digest] = outcome = one(step)
            if on_done:
                on_done(outcome)
        return
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    waiting = {s.digest: s for s in todo}
    planned = {s.digest for s in steps}
    running: dict[Future[Outcome], str] = {}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="q38-step") as pool:
        while waiting or running:
            for digest, step in list(waiting.items()):
                ready = all(d.digest in outcomes or d.digest not in planned
                            for _, d in step.deps)  # a substituted step's inputs are not
                if len(running) < jobs and ready:
                    running[pool.submit(one, step)] = digest
                    del waiting[digest]
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                running.pop(future)
                outcome = future.result()  # a failure: the with block waits for the rest
                outcomes[outcome.step.digest] = outcome
                if on_done:
                    on_done(outcome)


def _closure(step: Step) -> set[str]:
    from qwen38build.engine.step import closure

    return {s.digest for s in closure(step)}


def _realise_one(
    step: Step, index: int, total: int, store: Store, reporter: Reporter,
    source_stores: list[Store], source_dirs: list[Path], substituters: Substituters | None,
) -> Outcome:
    t0 = time.perf_counter()
    entry = store.get(step.digest)
    built = False
    if entry is None:
        reporter.step_start(step, index, total)
        with store.lock(step.digest):
            had = store.lookup(step.digest) is not None
            entry = store.trusted(step.digest)  # another build may have made it meanwhile
            if entry is None:
                if had:
                    reporter.note(step, "its store entry changed since written; rebuilding")
                if substituters is not None:  # verified there before it is committed
                    entry = substituters.substitute(step, store, reporter)
                if entry is None:
                    entry = _build(step, store, reporter, source_stores, source_dirs)
                    built = True
    outcome = Outcome(step, entry, built, time.perf_counter() - t0)
    reporter.step_done(step, index, total, built=built, seconds=outcome.seconds)
    return outcome


def _outputs_named(store: Store, filename: str, sha256: str) -> Iterable[Path]:
    for digest in store.entries():
        try:
            entry = store.lookup(digest)
        except StoreError:
            continue
        rec = entry.outputs.get(filename) if entry is not None else None
        if entry is not None and rec is not None and rec["sha256"] == sha256:
            yield entry.path / filename


def _build(
    step: Step, store: Store, reporter: Reporter, source_stores: list[Store],
    source_dirs: list[Path],
) -> Entry:
    module = kind_module(step.kind)
    with store.hold() as session:
        scratch = store.work_dir(session, "scratch")
        try:

            def fill(out: Path) -> dict[str, str]:
                ctx = Context(step, out, scratch, store, reporter, source_stores, source_dirs)
                module.run(ctx)
                ctx.check_used()
                return ctx.hashed

            return store.add(step.digest, step.derivation(), fill)
        finally:
            remove_tree(scratch)
