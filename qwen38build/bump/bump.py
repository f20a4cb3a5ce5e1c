"""bump: what moving the vLLM pin means for every patch of the series, at once.

``bump`` locks the new wheel, extracts from the old and the new pristine wheels only the
files the series touches (never the whole wheel), and tries every patch in series order
with GNU patch at fuzz 0 against the new pristine files, on top of the earlier patches that
applied. Each patch gets one outcome:

``clean``
    applies exactly.
``offset``
    applies, some hunks at other lines (which hunks, by how many lines).
``upstreamed``
    does not apply, but reverse-applies cleanly to the same tree (the new pristine files
    plus the earlier patches that applied): upstream carries it; a retire candidate.
``deleted``
    a file it changes is in the old wheel but not in the new one (deleted or moved; files
    of the new wheel with the same name are named as the likely new place).
``likely-upstreamed``
    does not apply, but every failing hunk's change is in the new pin in other words
    (:mod:`qwen38build.series.upstreamed`: its added lines in the upstream diff, or a change
    alike in the same region); shown side by side with the similarity. A retire
    candidate, as ``upstreamed`` is; ``--retire`` retires both.
``depends-on-failed``
    every hunk that fails stands, in the old pin's tree with the series applied up to
    it, on lines that an earlier patch which fails now brought in, and its own context
    lines (the rest) still stand in the new tree: fixing that patch comes first, and its
    own failure would be a false conflict. Where its own lines are gone too (upstream
    re-indented the region, say) it is a conflict of its own.
``conflict``
    anything else; each failing hunk is named with its file and the patch file's line, with
    the upstream change in that region (a unified diff of the old and new pristine file
    around the hunk).

The old tree with the series applied (for ``depends-on-failed`` and for locating a hunk in
the old pristine file; :class:`~qwen38build.series.lineage.Lineage`, in memory) is only built
when some patch fails. ``BumpReport.ok`` is True when
every patch is ``clean`` or ``offset``. Unless ``dry_run``, ``recipe.toml`` gets the new
``[vllm] version`` (edited with tomlkit: comments and layout stay) and ``lock/`` the new
wheel. With ``rebase=DIR``, the workspace in DIR (made first when DIR is new) is carried
onto the new pristine tree with git cherry-pick, stopping at the first conflict.

Where the new wheel comes from, in order: a fetch entry of the store for that exact file
(its sha256 is the one recorded when it was fetched); a file of that name in a directory of
``$QWEN38BUILD_SOURCES``; pip. The wheel then goes through the store like any fetch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from qwen38build.digest import sha256_file
from qwen38build.engine.fetch import locked_wheel, wheel_in_store
from qwen38build.errors import InputError, LockError, Qwen38BuildError
from qwen38build.inputs import lock as lockmod
from qwen38build.inputs.recipe import LoadedRecipe, SeriesEntry
from qwen38build.pinning import pylock as envlock
from qwen38build.series import upstreamed
from qwen38build.series.gnupatch import run_patch, scratch_parent
from qwen38build.series.lineage import Lineage
from qwen38build.series.patchfile import FileDiff, Hunk, PatchFile
from qwen38build.store.store import Store
from qwen38build.wheels import wheelzip
from qwen38build.workspace import workspace

Outcome = Literal["clean", "offset", "conflict", "upstreamed", "likely-upstreamed", "deleted",
                  "depends-on-failed"]
APPLIED: frozenset[str] = frozenset({"clean", "offset"})
FAILED: frozenset[str] = frozenset({"conflict", "deleted", "depends-on-failed",
                                    "likely-upstreamed"})
RETIRABLE: frozenset[str] = frozenset({"upstreamed", "likely-upstreamed"})
PACKAGE = "vllm"

_CHUNK_RE = re.compile(r"^(?:patching|checking) file '?(?P<path>.+?)'?$")
_FAIL_RE = re.compile(r"^Hunk #(?P<n>\d+) FAILED at (?P<line>\d+)")
_OK_RE = re.compile(
    r"^Hunk #(?P<n>\d+) succeeded at (?P<line>\d+)(?: \(offset (?P<off>-?\d+) lines?\))?"
)
_UHUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


# -- the report -------------------------------------------------------------------------


@dataclass(frozen=True)
class HunkOffset:
    file: str
    hunk: int  # 1-based within the file, as GNU patch counts
    line: int  # where it applied
    offset: int


@dataclass(frozen=True)
class HunkFailure:
    """A hunk that does not apply, and why as far as can be told."""

    file: str
    hunk: int  # 1-based within the file
    patch_line: int  # line of its @@ header in the patch file
    note: str
    upstream_diff: str = ""  # old → new pristine, around the hunk
    depends_on: tuple[str, ...] = ()  # earlier failed patches whose lines it stands on
    evidence: str = ""  # why it looks upstreamed in other words (empty: it does not)
    similarity: float | None = None  # difflib ratio of its change to upstream's
    side_by_side: str = ""  # ours | upstream, where there is evidence


@dataclass(frozen=True)
class PatchReport:
    patch: str  # the row name
    file: str  # the patch file, relative to the project root
    outcome: Outcome
    offsets: tuple[HunkOffset, ...] = ()
    failures: tuple[HunkFailure, ...] = ()
    deleted: tuple[str, ...] = ()
    moved_to: dict[str, list[str]] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()

    def summary(self) -> str:
        if self.outcome == "clean":
            return ""
        if self.outcome == "offset":
            return ", ".join(f"{o.file} #{o.hunk} {o.offset:+d}" for o in self.offsets)
        if self.outcome == "upstreamed":
            return "reverse-applies to the new tree: retire candidate"
        if self.outcome == "likely-upstreamed":
            return "; ".join(
                f"{h.file} #{h.hunk}: {h.evidence} (similarity {h.similarity:.2f})"
                for h in self.failures
            ) + ": retire candidate"
        if self.outcome == "deleted":
            parts = []
            for f in self.deleted:
                moved = self.moved_to.get(f)
                parts.append(f"{f} gone" + (f" (moved to {', '.join(moved)}?)" if moved else ""))
            return "; ".join(parts)
        if self.outcome == "depends-on-failed":
            return "stands on " + ", ".join(self.depends_on)
        return "; ".join(
            f"{h.file} hunk #{h.hunk} (line {h.patch_line})" for h in self.failures
        )


@dataclass(frozen=True)
class RebaseResult:
    """Where the workspace's carry onto the new pin stands."""

    repo: str
    branch: str
    done: tuple[str, ...]  # topics carried, in order
    empty: tuple[str, ...]  # topics whose change is already upstream (empty commits)
    stopped_at: str | None = None  # the topic whose cherry-pick conflicts
    conflict_files: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # topics not carried: retired by --retire

    @property
    def ok(self) -> bool:
        return self.stopped_at is None


@dataclass(frozen=True)
class EnvReport:
    """The environment lock re-made for the new pin: what moved, or why it could not be."""

    move: envlock.EnvMove | None
    torch: tuple[str, str] | None = None  # recipe [toolchain] torch, old → new
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "moved": None if self.move is None else self.move.to_json(),
            "recipe_torch": None if self.torch is None else {"from": self.torch[0],
                                                              "to": self.torch[1]},
            "error": self.error or None,
        }

    def lines(self) -> list[str]:
        out = ["", f"### Python environment ({lockmod.LOCK_DIR}/{envlock.PYLOCK})", ""]
        if self.error:
            return [*out, f"Not re-locked: {self.error}"]
        if self.torch is not None:
            out.append(f"- recipe [toolchain] torch {self.torch[0]} → {self.torch[1]} "
                       "(what the new pin requires)")
        return out + (self.move.lines() if self.move is not None else [])


@dataclass
class BumpReport:
    old_version: str
    new_version: str
    wheel: lockmod.LockedWheel
    patches: list[PatchReport]
    dry_run: bool
    seconds: float = 0.0
    rebase: RebaseResult | None = None
    retired: tuple[str, ...] = ()  # rows moved to series.retired by --retire
    environment: EnvReport | None = None  # None: the project has no environment lock

    @property
    def ok(self) -> bool:
        """True when every patch applies (clean or with offsets) or was retired."""
        return all(p.outcome in APPLIED or p.patch in self.retired for p in self.patches)

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.old_version,
            "to": self.new_version,
            "ok": self.ok,
            "dry_run": self.dry_run,
            "seconds": round(self.seconds, 3),
            "wheel": asdict(self.wheel),
            "patches": [asdict(p) for p in self.patches],
            "retired": list(self.retired),
            "rebase": None if self.rebase is None else {
                **asdict(self.rebase), "ok": self.rebase.ok,
            },
            "environment": None if self.environment is None else self.environment.to_json(),
        }

    def to_markdown(self) -> str:
        counts: dict[str, int] = {}
        for p in self.patches:
            counts[p.outcome] = counts.get(p.outcome, 0) + 1
        out = [
            f"vllm {self.old_version} → {self.new_version}: "
            + ", ".join(f"{n} {k}" for k, n in counts.items())
            + ("" if not self.dry_run else " (dry run: recipe and lock untouched)"),
            "",
            "| # | patch | outcome | detail |",
            "|---|---|---|---|",
        ]
        for i, p in enumerate(self.patches, 1):
            detail = p.summary().replace("|", "\\|")
            out.append(f"| {i} | {p.patch} | {p.outcome} | {detail} |")
        for p in self.patches:
            shown = [h for h in p.failures
                     if p.outcome in ("conflict", "depends-on-failed", "likely-upstreamed")]
            if not shown:
                continue
            out += ["", f"### {p.patch} ({p.outcome})"]
            for h in shown:
                out += ["", f"- {h.file} hunk #{h.hunk} ({p.file}:{h.patch_line}): {h.note}"]
                if h.similarity is not None and not h.side_by_side:
                    out[-1] += (f" (similarity to upstream's change {h.similarity:.2f}, "
                                f"below {upstreamed.THRESHOLD})")
                if h.side_by_side:
                    out += ["", f"similarity {h.similarity:.2f} (threshold "
                            f"{upstreamed.THRESHOLD}):", "", "```", h.side_by_side, "```"]
                elif h.upstream_diff:
                    out += ["", "```diff", h.upstream_diff.rstrip("\n"), "```"]
        retire = [p.patch for p in self.patches if p.outcome in RETIRABLE]
        if self.retired:
            out += ["", f"Retired: {', '.join(self.retired)} (series.retired, files deleted, "
                    "prose in PATCHES.md)."]
        elif retire:
            out += ["", f"Retire candidates: {', '.join(retire)}. `qwen38build bump vllm "
                    f"{self.new_version} --retire` (with `--rebase DIR` to carry the "
                    "workspace) moves them to series.retired, deletes their files and keeps "
                    "their prose in PATCHES.md's retired section."]
        if self.environment is not None:
            out += self.environment.lines()
        if self.rebase is not None:
            r = self.rebase
            out.append("")
            if r.ok:
                out.append(f"Workspace {r.repo}: branch {r.branch} carries every topic.")
            else:
                out.append(
                    f"Workspace {r.repo}: branch {r.branch} stopped at topic {r.stopped_at}, "
                    f"conflicts in {', '.join(r.conflict_files)}; resolve, `git add`, "
                    "`git cherry-pick --continue`, then `qwen38build export`."
                )
            if r.empty:
                out.append(f"Empty after the carry (upstream has them): {', '.join(r.empty)}.")
            if r.skipped:
                out.append(f"Not carried (retired): {', '.join(r.skipped)}.")
        return "\n".join(out) + "\n"


# -- resolving the new wheel -------------------------------------------------------------


def resolve_wheel(
    loaded: LoadedRecipe, store: Store, version: str
) -> tuple[lockmod.LockedWheel, Path]:
    """Lock ``vllm==version`` (same tags as the recipe) and return it with its store path."""
    pin = loaded.recipe.vllm.model_copy(update={"version": version})
    filename = pin.wheel_filename
    python = loaded.recipe.toolchain.python

    def entry(sha: str, size: int, name: str = filename) -> lockmod.LockedWheel:
        return lockmod.LockedWheel(
            name=pin.name, version=version, filename=name, python_tag=pin.python_tag,
            abi_tag=pin.abi_tag, platform_tag=pin.platform_tag, sha256=sha, size=size,
        )

    found = _in_store(store, filename)
    if found is not None:
        e = entry(*found)
        return e, wheel_in_store(loaded, store, e)
    for d in filter(None, os.environ.get("QWEN38BUILD_SOURCES", "").split(os.pathsep)):
        p = Path(d) / filename
        if p.is_file():
            e = entry(sha256_file(p), p.stat().st_size)
            return e, wheel_in_store(loaded, store, e)
    from qwen38build.steps.fetch import pip_download

    with tempfile.TemporaryDirectory(prefix="q38-bump.") as tmp:
        got = pip_download(pin.name, version, python=python, platform=pin.platform_tag,
                           dest=Path(tmp))
        if got.name != filename:
            raise LockError(
                f"pip fetched {got.name} for {pin.name}=={version}, but the recipe's tags "
                f"ask for {filename}.",
                hint="check [vllm] python_tag, abi_tag and platform_tag",
            )
        e = entry(sha256_file(got), got.stat().st_size)
        return e, wheel_in_store(loaded, store, e, source_dirs=[Path(tmp)])


def _in_store(store: Store, filename: str) -> tuple[str, int] | None:
    """(sha256, size) of a fetched ``filename`` in the store: a fetch is keyed by its file
    name (which carries name, version and tags) and sha256 alone."""
    for digest in store.entries():
        try:
            meta = json.loads(store.meta_path(digest).read_bytes())
        except (OSError, ValueError):
            continue
        drv = meta.get("derivation", {})
        params = drv.get("params", {})
        if drv.get("kind") != "fetch" or params.get("filename") != filename:
            continue
        entry = store.get(digest)
        if entry is None:
            continue  # changed since written: not to be trusted
        return str(params["sha256"]), int(entry.outputs[filename]["size"])
    return None


# -- trees ------------------------------------------------------------------------------


def _read_members(wheel: Path, rels: set[str]) -> tuple[dict[str, bytes | None], set[str]]:
    """The package files ``rels`` of ``wheel`` (None where absent) and its package paths."""
    prefix = f"{PACKAGE}/"
    # Through the one member check: a wheel with an unsafe member is refused here too.
    names = {n[len(prefix):] for n in wheelzip.member_infos(wheel) if n.startswith(prefix)}
    files = {rel: (wheelzip.read(wheel, prefix + rel) if rel in names else None)
             for rel in rels}
    return files, names


def _write_tree(root: Path, files: dict[str, bytes | None]) -> None:
    for rel, data in files.items():
        if data is not None:
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)


def _lines(data: bytes | None) -> list[str]:
    if data is None:
        return []
    return data.decode("utf-8", "surrogateescape").split("\n")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _find(have: list[str], want: list[str], near: int) -> int | None:
    """0-based index of ``want`` in ``have`` nearest to 1-based line ``near``, or None."""
    if not want:
        return None
    n = len(want)
    first = want[0]
    hits = [i for i in range(len(have) - n + 1) if have[i] == first and have[i:i + n] == want]
    return min(hits, key=lambda i: abs(i + 1 - near)) if hits else None


@dataclass
class _GnuFile:
    failed: dict[int, int] = field(default_factory=dict)  # hunk → line tried
    skipped: bool = False  # "Skipping patch": no hunk of this file was tried
    ok: dict[int, tuple[int, int]] = field(default_factory=dict)  # hunk → (line, offset)


def _gnu_by_file(output: str) -> dict[str, _GnuFile]:
    out: dict[str, _GnuFile] = {}
    cur: _GnuFile | None = None
    for line in output.splitlines():
        if m := _CHUNK_RE.match(line):
            cur = out.setdefault(m.group("path"), _GnuFile())
        elif cur is None:
            continue
        elif m := _FAIL_RE.match(line):
            cur.failed[int(m.group("n"))] = int(m.group("line"))
        elif m := _OK_RE.match(line):
            cur.ok[int(m.group("n"))] = (int(m.group("line")), int(m.group("off") or 0))
        elif "Skipping patch" in line:
            cur.skipped = True
    return out


def _diff_hunks(old: Path, new: Path) -> list[tuple[int, int, list[str]]]:
    """The hunks of ``diff -U3 old new``: (old start, old count, lines with the @@ line).

    GNU diff, not difflib: on a 3,000-line file with a release's worth of changes difflib
    takes a large part of a second, diff a few milliseconds.
    """
    args = ["diff", "-U3", str(old) if old.exists() else "/dev/null",
            str(new) if new.exists() else "/dev/null"]
    proc = subprocess.run(args, capture_output=True, env={"LC_ALL": "C", "PATH":
                          os.environ.get("PATH", "/usr/bin:/bin")}, check=False)
    hunks: list[tuple[int, int, list[str]]] = []
    for line in proc.stdout.decode("utf-8", "surrogateescape").split("\n"):
        if m := _UHUNK_RE.match(line):
            count = int(m.group(2)) if m.group(2) is not None else 1
            hunks.append((int(m.group(1)), count, [line]))
        elif hunks and line:
            hunks[-1][2].append(line)
    return hunks


def _upstream_diff(rel: str, hunks: list[tuple[int, int, list[str]]], lo: int, hi: int,
                   versions: tuple[str, str]) -> str:
    """The hunks of the old → new pristine diff of ``rel`` that touch lines lo..hi (1-based)."""
    keep = [ln for start, count, lines in hunks
            if start <= hi + 3 and start + count >= lo - 3 for ln in lines]
    if not keep:
        return ""
    header = [f"--- a/{rel} ({versions[0]})", f"+++ b/{rel} ({versions[1]})"]
    return "\n".join(header + keep) + "\n"


# -- trying the series --------------------------------------------------------------------


class _Trial:
    def __init__(self, tmp: Path, entries: list[SeriesEntry], patches: list[PatchFile],
                 old: dict[str, bytes | None], new: dict[str, bytes | None],
                 old_names: set[str], new_names: set[str], versions: tuple[str, str],
                 root: Path) -> None:
        self.work = tmp / "work"
        self.work.mkdir()
        _write_tree(self.work, new)
        self.tmp = tmp
        self.entries = entries
        self.patches = patches
        self.old, self.new = old, new
        self.old_names, self.new_names = old_names, new_names
        self.versions = versions
        self.root = root
        self._chain: Lineage | None = None
        self._upstream: dict[str, list[tuple[int, int, list[str]]]] = {}
        self.outcomes: list[Outcome] = []

    def chain(self, k: int) -> Lineage:
        if self._chain is None:
            self._chain = Lineage(self.tmp / "old", self.old, self.patches)
        self._chain.advance_to(k)
        return self._chain

    def run(self) -> list[PatchReport]:
        reports = []
        for k, (entry, pf) in enumerate(zip(self.entries, self.patches, strict=True)):
            report = self.try_patch(k, entry, pf)
            self.outcomes.append(report.outcome)
            reports.append(report)
        return reports

    def try_patch(self, k: int, entry: SeriesEntry, pf: PatchFile) -> PatchReport:
        try:
            file = str(entry.path.relative_to(self.root))
        except ValueError:
            file = str(entry.path)
        name = entry.row_name
        gone = [
            f.old_path for f in pf.files
            if f.old_path is not None and self.old.get(f.old_path) is not None
            and self.new.get(f.old_path) is None
        ]
        if gone:
            moved = {g: self._moved(g) for g in gone}
            return PatchReport(name, file, "deleted", deleted=tuple(gone),
                               moved_to={g: m for g, m in moved.items() if m})
        snapshot = {rel: _read(self.work / rel) for rel in pf.touched_paths}
        result = run_patch(pf.path, self.work)
        if result.ok:
            offsets = tuple(
                HunkOffset(h.file, h.number, h.line, h.offset) for h in result.offsets
            )
            return PatchReport(name, file, "offset" if offsets else "clean",
                               offsets=offsets)
        for rel, data in snapshot.items():  # GNU patch keeps the hunks that did apply
            p = self.work / rel
            if data is None:
                p.unlink(missing_ok=True)
            else:
                p.write_bytes(data)
        if run_patch(pf.path, self.work, reverse=True, dry_run=True).ok:
            return PatchReport(name, file, "upstreamed")
        failures = self._failures(k, pf, _gnu_by_file(result.output))
        depends = tuple(dict.fromkeys(d for h in failures for d in h.depends_on))
        if failures and all(h.evidence for h in failures):
            return PatchReport(name, file, "likely-upstreamed", failures=failures)
        if failures and all(h.depends_on for h in failures):
            return PatchReport(name, file, "depends-on-failed", failures=failures,
                               depends_on=depends)
        return PatchReport(name, file, "conflict", failures=failures, depends_on=depends)

    def upstream_hunks(self, rel: str) -> list[tuple[int, int, list[str]]]:
        """The old → new pristine diff of ``rel``, computed once."""
        if rel not in self._upstream:
            # Flat names: every directory made here costs a mkdir and an rmdir.
            flat = rel.replace("/", "%")
            sides = []
            for side, files in (("old", self.old), ("new", self.new)):
                p = self.tmp / f"{side}%{flat}"
                data = files.get(rel)
                if data is not None:
                    p.write_bytes(data)
                sides.append(p)
            self._upstream[rel] = _diff_hunks(*sides)
        return self._upstream[rel]

    def _moved(self, rel: str) -> list[str]:
        name = rel.rsplit("/", 1)[-1]
        return sorted(
            n for n in self.new_names - self.old_names if n.rsplit("/", 1)[-1] == name
        )

    def _failures(self, k: int, pf: PatchFile, gnu: dict[str, _GnuFile]) -> tuple[HunkFailure, ...]:
        out: list[HunkFailure] = []
        for fd in pf.files:
            have = _lines(_read(self.work / fd.path)) if fd.old_path else []
            exists = (self.work / fd.path).exists()
            g = gnu.get(fd.path, _GnuFile())
            if fd.old_path is not None and not exists:
                out += [self._failure(k, fd, i, "the file is not in the tree")
                        for i in range(len(fd.hunks))]
                continue
            if fd.old_path is None and exists:
                out.append(self._failure(k, fd, 0, "the patch creates it, but the new pin "
                                         "already has this file"))
                continue
            for i, hunk in enumerate(fd.hunks):
                n = i + 1
                if n in g.failed:
                    note = f"FAILED at line {g.failed[n]}"
                elif g.skipped and _find(have, hunk.old_lines, hunk.old_start) is None:
                    note = "does not apply"
                else:
                    continue
                if _find(have, hunk.new_lines, hunk.new_start) is not None:
                    note += "; its result is already in the new file (upstreamed in part)"
                out.append(self._failure(k, fd, i, note))
        return tuple(out)

    def _failure(self, k: int, fd: FileDiff, i: int, note: str) -> HunkFailure:
        hunk: Hunk | None = fd.hunks[i] if i < len(fd.hunks) else None
        rel = fd.old_path or fd.path
        chain = self.chain(k)
        text = chain.text.get(rel, [])
        origin = chain.origin.get(rel, [])
        lo = hi = 0
        depends: list[str] = []
        own_gone = False
        if hunk is not None:
            at = _find(text, hunk.old_lines, hunk.old_start)
            span = origin[at:at + len(hunk.old_lines)] if at is not None else []
            if at is None and hunk.old_lines:
                note += "; its context is not in the old pin's tree either"
            failed = [o.patch is not None and self.outcomes[o.patch] in FAILED for o in span]
            depends = [self.entries[o.patch].row_name for o, f in zip(span, failed, strict=True)
                       if f and o.patch is not None]
            if depends:
                # depends-on-failed only when the hunk's own context (the lines no failed
                # patch brought in) still stands in the new tree.
                have = _lines(_read(self.work / fd.path))
                own_gone = any(_find(have, run, hunk.old_start) is None
                               for run in _runs(hunk.old_lines, failed))
            olds = [o.line for o in span if o.patch is None]
            if olds:
                lo, hi = min(olds), max(olds)
            else:
                lo, hi = hunk.old_start, hunk.old_start + max(hunk.old_count - 1, 0)
        if not hunk and fd.old_path is None:
            lo, hi = 1, len(_lines(self.new.get(rel)))
        upstream = ""
        uhunks: list[tuple[int, int, list[str]]] = []
        if lo and (self.old.get(rel) is not None or self.new.get(rel) is not None):
            uhunks = self.upstream_hunks(rel)
            upstream = _upstream_diff(rel, uhunks, lo, hi, self.versions)
        found = upstreamed.evidence(hunk, uhunks, lo, hi) if hunk is not None else None
        names = ", ".join(dict.fromkeys(depends))
        if depends and own_gone:
            note += (f"; part of its context came from {names}, but its own context lines "
                     "are gone from the new pin: a conflict of its own, re-cutting "
                     f"{names} will not fix it")
            depends = []
        elif depends:
            note += f"; its context came from {names}"
        elif hunk is not None and not upstream and self.old.get(rel) is not None:
            note += "; upstream did not change these lines"
        likely = found is not None and found.likely
        if found is not None and found.likely:
            note += f"; likely upstreamed: {found.note}"
        return HunkFailure(
            file=fd.path, hunk=i + 1, patch_line=hunk.patch_line if hunk else fd.patch_line,
            note=note, upstream_diff=upstream, depends_on=tuple(dict.fromkeys(depends)),
            evidence=found.note if found and likely else "",
            similarity=round(found.similarity, 3) if found and uhunks else None,
            side_by_side=found.side_by_side if found and likely else "",
        )


def _runs(lines: list[str], skip: list[bool]) -> list[list[str]]:
    """The maximal runs of ``lines`` whose ``skip`` flag is False."""
    runs: list[list[str]] = [[]]
    for line, s in zip(lines, skip, strict=True):
        if s:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(line)
    return [r for r in runs if r]


def try_series(
    loaded: LoadedRecipe, old_wheel: Path, new_wheel: Path, versions: tuple[str, str]
) -> list[PatchReport]:
    """Classify every series entry against ``new_wheel`` (the old one for context)."""
    entries = loaded.series_entries()
    patches = [PatchFile.parse(e.path) for e in entries]
    touched: set[str] = set()
    for pf in patches:
        touched.update(pf.touched_paths)
    old, old_names = _read_members(old_wheel, touched)
    new, new_names = _read_members(new_wheel, touched)
    with tempfile.TemporaryDirectory(prefix="q38-bump.", dir=scratch_parent()) as tmp:
        trial = _Trial(Path(tmp), entries, patches, old, new, old_names, new_names, versions,
                       loaded.root)
        return trial.run()


# -- bump -------------------------------------------------------------------------------


def bump(
    loaded: LoadedRecipe, store: Store, new_version: str, dry_run: bool = True,
    rebase: Path | None = None, retire: bool = False,
) -> BumpReport:
    """Try the series on vllm ``new_version``; unless ``dry_run``, re-pin recipe and lock,
    and with ``retire`` retire every upstreamed and likely-upstreamed patch
    (:mod:`qwen38build.series.retire`)."""
    from packaging.version import InvalidVersion, Version

    t0 = time.perf_counter()
    try:
        Version(new_version)
    except InvalidVersion:
        raise InputError(f"{new_version!r} is not a PEP 440 version.") from None
    old_version = loaded.recipe.vllm.version
    old_wheel = locked_wheel(loaded, store)
    new_entry, new_wheel = resolve_wheel(loaded, store, new_version)
    patches = try_series(loaded, old_wheel, new_wheel, (old_version, new_version))
    report = BumpReport(old_version, new_version, new_entry, patches, dry_run)
    reasons = {p.patch: f"{p.outcome} in {new_version}: {p.summary()}"
               for p in patches if p.outcome in RETIRABLE} if retire and not dry_run else {}
    report.environment, env_lock = relock_environment(loaded, new_entry, new_wheel)
    if rebase is not None:
        topics = {e.row_name: e.topic for e in loaded.series_entries()}
        report.rebase = rebase_workspace(loaded, store, rebase, new_version, new_wheel,
                                         skip=frozenset(topics[r] for r in reasons))
    if not dry_run:
        torch = report.environment.torch if report.environment is not None else None
        repin(loaded, new_entry, torch=torch[1] if torch else None)
        if env_lock is not None:
            envlock.write(loaded.root, env_lock)
        if reasons:
            from qwen38build.series.retire import retire as retire_topics

            retire_topics(loaded, reasons, new_version)
            report.retired = tuple(reasons)
    report.seconds = time.perf_counter() - t0
    return report


def relock_environment(
    loaded: LoadedRecipe, entry: lockmod.LockedWheel, wheel: Path
) -> tuple[EnvReport | None, envlock.Locked | None]:
    """Lock the environment for the new pin (nothing written) and compare with the current.

    A project without an environment lock gets None. When the recipe's torch is excluded
    by the new pin but the pin names one version, the lock takes that one and the report
    says the recipe's torch moves with it. A failure (uv, the network) is reported, not
    raised: the per-patch report stands on its own.
    """
    path = envlock.pylock_path(loaded.root)
    if not path.is_file():
        return None, None
    try:
        old = envlock.packages_of(path.read_text(encoding="utf-8"), str(path))
        pin = f"{entry.name} {entry.version}"
        torch = envlock.torch_for(loaded, pin, envlock.pin_requirements(loaded, entry, wheel))
        locked = envlock.compute(loaded, entry, wheel, torch=torch)
        new = locked.packages
    except Qwen38BuildError as exc:
        return EnvReport(None, error=str(exc).replace("\n", " ")), None
    was = loaded.recipe.toolchain.torch
    return EnvReport(envlock.diff(old, new), (was, torch) if torch != was else None), locked


def repin(loaded: LoadedRecipe, entry: lockmod.LockedWheel, *, torch: str | None = None) -> None:
    """Set ``[vllm] version`` (and ``[toolchain] torch`` when given) in recipe.toml, layout
    and comments kept, and lock the wheel."""
    import tomlkit

    from qwen38build.inputs.recipe import validate

    text = loaded.path.read_text(encoding="utf-8")
    doc = tomlkit.parse(text)
    doc["vllm"]["version"] = entry.version
    if torch is not None:
        doc["toolchain"]["torch"] = torch
    new_text = tomlkit.dumps(doc)
    validate(tomlkit.parse(new_text).unwrap(), loaded.path)
    others = [e for n, e in lockmod.read(loaded.root).items() if n != entry.name]
    from qwen38build.store.store import atomic_write

    atomic_write(loaded.path, new_text.encode("utf-8"))
    lockmod.write(loaded.root, [*others, entry])


# -- rebase -----------------------------------------------------------------------------


def rebase_workspace(
    loaded: LoadedRecipe, store: Store, repo: Path, new_version: str, new_wheel: Path,
    skip: frozenset[str] = frozenset(),
) -> RebaseResult:
    """Carry the workspace's topics onto the new pristine package with git cherry-pick.

    The new pristine package is committed as a child of ``v<old>`` and tagged
    ``v<new>``; branch ``qwen38-<new>`` starts there and gets each topic commit of
    ``v<old>..HEAD`` in order (3-way, diff3 conflict style). At a conflict it stops, with
    git's cherry-pick state in place: resolve, ``git add``, ``git cherry-pick --continue``.
    """
    repo = repo.resolve()
    if not repo.exists() or not any(repo.iterdir()):
        workspace.create(loaded, store, repo)
    git = workspace.git
    old_tag = workspace.pin_tag(loaded.recipe.vllm.version)
    new_tag = workspace.pin_tag(new_version)
    branch = f"{workspace.BRANCH}-{new_version}"
    if git(repo, "status", "--porcelain", "--untracked-files=no").strip():
        raise InputError(f"{repo}: the workspace has uncommitted changes.",
                         hint="commit or stash them first")
    if git(repo, "rev-parse", "-q", "--verify", f"refs/tags/{new_tag}", check=False).strip():
        raise InputError(f"{repo}: tag {new_tag} exists already: the carry was started.",
                         hint=f"continue on branch {branch}, or use a fresh workspace")
    touched: set[str] = set()
    for e in loaded.series_entries():
        touched.update(PatchFile.parse(e.path).touched_paths)
    with tempfile.TemporaryDirectory(prefix="q38-rebase.") as tmp:
        tree_dir = Path(tmp) / "tree"
        workspace.extract_package(new_wheel, tree_dir / PACKAGE, touched)
        env = {**workspace.git_env(), "GIT_INDEX_FILE": str(Path(tmp) / "index")}

        def tgit(*args: str, stdin: str | None = None) -> str:
            return subprocess.run(
                ["git", f"--work-tree={tree_dir}", *args], cwd=repo, input=stdin,
                capture_output=True, text=True, env=env, check=True,
            ).stdout

        tgit("add", "-A", "--", PACKAGE)
        tree = tgit("write-tree").strip()
        base = git(repo, "rev-parse", f"{old_tag}^{{commit}}").strip()
        pristine = git(repo, "commit-tree", tree, "-p", base,
                       stdin=workspace.pristine_subject(new_version) + "\n").strip()
    old_head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "tag", new_tag, pristine)
    git(repo, "checkout", "-q", "-B", branch, pristine)
    # One range (or one list), so that git's sequencer carries the rest after
    # `cherry-pick --continue`; topics in ``skip`` (and their fixups) are left out.
    picks = [f"{old_tag}..{old_head}"]
    skipped: list[str] = []
    if skip:
        picks = []
        for c in workspace.read_commits(repo, f"{old_tag}..{old_head}"):
            subject = c.subject
            for prefix in workspace.FOLD_PREFIXES:
                subject = subject.removeprefix(prefix)
            topic = subject.removeprefix(workspace.SUBJECT_PREFIX)
            if topic in skip:
                skipped.append(topic)
            else:
                picks.append(c.sha)
    proc = subprocess.run(
        ["git", "-c", "merge.conflictStyle=diff3", "cherry-pick", "--keep-redundant-commits",
         "--allow-empty", *picks],
        cwd=repo, capture_output=True, text=True, env=workspace.git_env(), check=False,
    ) if picks else subprocess.CompletedProcess([], 0, "", "")
    done: list[str] = []
    empty: list[str] = []
    for c in workspace.read_commits(repo, f"{new_tag}..HEAD"):
        topic = c.subject.removeprefix(workspace.SUBJECT_PREFIX)
        done.append(topic)
        parent_tree = git(repo, "rev-parse", f"{c.parent}^{{tree}}").strip() if c.parent else ""
        if parent_tree == c.tree:
            empty.append(topic)
    skipped_t = tuple(dict.fromkeys(skipped))
    if proc.returncode == 0:
        return RebaseResult(str(repo), branch, tuple(done), tuple(empty), skipped=skipped_t)
    stuck = git(repo, "log", "-1", "--format=%s", "CHERRY_PICK_HEAD", check=False).strip()
    files = git(repo, "diff", "--name-only", "--diff-filter=U").split()
    return RebaseResult(
        str(repo), branch, tuple(done), tuple(empty),
        stuck.removeprefix(workspace.SUBJECT_PREFIX) or "(see git status)",
        tuple(files) or ("(see git status)",), skipped=skipped_t,
    )
