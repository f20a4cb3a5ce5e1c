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
``depends-on-failed``
    every hunk that fails stands, in the old pin's tree with the series applied up to
    it, on lines that an earlier patch which fails now brought in: fixing that patch
    comes first, and its own failure would be a false conflict.
``conflict``
    anything else; each failing hunk is named with its file and the patch file's line, with
    the upstream change in that region (a unified diff of the old and new pristine file
    around the hunk).

The old tree with the series applied (for ``depends-on-failed`` and for locating a hunk in
the old pristine file) is only built when some patch fails. ``BumpReport.ok`` is True when
every patch is ``clean`` or ``offset``. Unless ``dry_run``, ``recipe.toml`` gets the new
``[vllm] version`` (edited with tomlkit: comments and layout stay) and ``lock/`` the new
wheel. With ``rebase=DIR``, the workspace in DIR (made first when DIR is new) is carried
onto the new pristine tree with git cherry-pick, stopping at the first conflict.

Where the new wheel comes from, in order: a fetch entry of the store for that exact file
(its sha256 is the one recorded when it was fetched); a file of that name in a directory of
``$QWEN38BUILD_SOURCES``; pip. The wheel then goes through the store like any fetch.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from qwen38build import lock as lockmod
from qwen38build import wheelzip, workspace
from qwen38build.digest import sha256_file
from qwen38build.errors import InputError, LockError
from qwen38build.gnupatch import run_patch
from qwen38build.patchfile import FileDiff, Hunk, PatchFile
from qwen38build.recipe import LoadedRecipe, SeriesEntry
from qwen38build.store import Store

Outcome = Literal["clean", "offset", "conflict", "upstreamed", "deleted", "depends-on-failed"]
APPLIED: frozenset[str] = frozenset({"clean", "offset"})
FAILED: frozenset[str] = frozenset({"conflict", "deleted", "depends-on-failed"})
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

    @property
    def ok(self) -> bool:
        return self.stopped_at is None


@dataclass
class BumpReport:
    old_version: str
    new_version: str
    wheel: lockmod.LockedWheel
    patches: list[PatchReport]
    dry_run: bool
    seconds: float = 0.0
    rebase: RebaseResult | None = None

    @property
    def ok(self) -> bool:
        """True when every patch applies (clean or with offsets)."""
        return all(p.outcome in APPLIED for p in self.patches)

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.old_version,
            "to": self.new_version,
            "ok": self.ok,
            "dry_run": self.dry_run,
            "seconds": round(self.seconds, 3),
            "wheel": asdict(self.wheel),
            "patches": [asdict(p) for p in self.patches],
            "rebase": None if self.rebase is None else {
                **asdict(self.rebase), "ok": self.rebase.ok,
            },
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
            shown = [h for h in p.failures if p.outcome in ("conflict", "depends-on-failed")]
            if not shown:
                continue
            out += ["", f"### {p.patch} ({p.outcome})"]
            for h in shown:
                out += ["", f"- {h.file} hunk #{h.hunk} ({p.file}:{h.patch_line}): {h.note}"]
                if h.upstream_diff:
                    out += ["", "```diff", h.upstream_diff.rstrip("\n"), "```"]
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

    found = _in_store(store, pin.name, version, filename, python, pin.platform_tag)
    if found is not None:
        e = entry(*found)
        return e, workspace.wheel_in_store(loaded, store, e)
    for d in filter(None, os.environ.get("QWEN38BUILD_SOURCES", "").split(os.pathsep)):
        p = Path(d) / filename
        if p.is_file():
            e = entry(sha256_file(p), p.stat().st_size)
            return e, workspace.wheel_in_store(loaded, store, e)
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
        return e, workspace.wheel_in_store(loaded, store, e, source_dirs=[Path(tmp)])


def _in_store(
    store: Store, name: str, version: str, filename: str, python: str, platform: str
) -> tuple[str, int] | None:
    want = {"name": name, "version": version, "filename": filename, "python": python,
            "platform": platform}
    for digest in store.entries():
        try:
            meta = json.loads(store.meta_path(digest).read_bytes())
        except (OSError, ValueError):
            continue
        drv = meta.get("derivation", {})
        params = drv.get("params", {})
        if drv.get("kind") != "fetch" or any(params.get(k) != v for k, v in want.items()):
            continue
        if store.get(digest) is None:
            continue  # changed since written: not to be trusted
        return str(params["sha256"]), int(params["size"])
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


class _OldChain:
    """The old pin's touched files with the series applied up to a patch, line by line.

    Each line carries its origin: the index of the patch that brought it in (None for the
    pristine file) and its line in the old pristine file (None for added lines).
    """

    def __init__(self, root: Path, old: dict[str, bytes | None],
                 patches: list[PatchFile]) -> None:
        self.root = root
        self.patches = patches
        self.next = 0
        _write_tree(root, old)
        self.text = {rel: _lines(data) for rel, data in old.items()}
        self.origin: dict[str, list[tuple[int | None, int | None]]] = {
            rel: [(None, i + 1) for i in range(len(lines))] if old[rel] is not None else []
            for rel, lines in self.text.items()
        }
        self.broken: list[int] = []  # patches that do not apply even on the old pin

    def advance_to(self, k: int) -> None:
        """Apply patches up to (not including) ``k``."""
        while self.next < k:
            j = self.next
            self.next += 1
            pf = self.patches[j]
            if not run_patch(pf.path, self.root).ok:
                self.broken.append(j)
            for rel in pf.touched_paths:
                new = _lines(_read(self.root / rel))
                self.origin[rel] = _carry(self.text.get(rel, []), new,
                                          self.origin.get(rel, []), j)
                self.text[rel] = new


def _carry(
    a: list[str], b: list[str], origin: list[tuple[int | None, int | None]], j: int
) -> list[tuple[int | None, int | None]]:
    if a == b:
        return origin
    pre = 0
    while pre < min(len(a), len(b)) and a[pre] == b[pre]:
        pre += 1
    suf = 0
    while suf < min(len(a), len(b)) - pre and a[-1 - suf] == b[-1 - suf]:
        suf += 1
    out = origin[:pre]
    sm = difflib.SequenceMatcher(None, a[pre:len(a) - suf], b[pre:len(b) - suf], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out += origin[pre + i1:pre + i2]
        else:
            out += [(j, None)] * (j2 - j1)
    out += origin[len(a) - suf:]
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
        self._chain: _OldChain | None = None
        self._upstream: dict[str, list[tuple[int, int, list[str]]]] = {}
        self.outcomes: list[Outcome] = []

    def chain(self, k: int) -> _OldChain:
        if self._chain is None:
            self._chain = _OldChain(self.tmp / "old", self.old, self.patches)
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
        if hunk is not None:
            at = _find(text, hunk.old_lines, hunk.old_start)
            span = origin[at:at + len(hunk.old_lines)] if at is not None else []
            if at is None and hunk.old_lines:
                note += "; its context is not in the old pin's tree either"
            for src, _ in span:
                if src is not None and self.outcomes[src] in FAILED:
                    depends.append(self.entries[src].row_name)
            olds = [ln for _, ln in span if ln is not None]
            if olds:
                lo, hi = min(olds), max(olds)
            else:
                lo, hi = hunk.old_start, hunk.old_start + max(hunk.old_count - 1, 0)
        if not hunk and fd.old_path is None:
            lo, hi = 1, len(_lines(self.new.get(rel)))
        upstream = ""
        if lo and (self.old.get(rel) is not None or self.new.get(rel) is not None):
            upstream = _upstream_diff(rel, self.upstream_hunks(rel), lo, hi, self.versions)
        if depends:
            note += "; its context came from " + ", ".join(dict.fromkeys(depends))
        elif hunk is not None and not upstream and self.old.get(rel) is not None:
            note += "; upstream did not change these lines"
        return HunkFailure(
            file=fd.path, hunk=i + 1, patch_line=hunk.patch_line if hunk else fd.patch_line,
            note=note, upstream_diff=upstream, depends_on=tuple(dict.fromkeys(depends)),
        )


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
    with tempfile.TemporaryDirectory(prefix="q38-bump.") as tmp:
        trial = _Trial(Path(tmp), entries, patches, old, new, old_names, new_names, versions,
                       loaded.root)
        return trial.run()


# -- bump -------------------------------------------------------------------------------


def bump(
    loaded: LoadedRecipe, store: Store, new_version: str, dry_run: bool = True,
    rebase: Path | None = None,
) -> BumpReport:
    """Try the series on vllm ``new_version``; unless ``dry_run``, re-pin recipe and lock."""
    from packaging.version import InvalidVersion, Version

    t0 = time.perf_counter()
    try:
        Version(new_version)
    except InvalidVersion:
        raise InputError(f"{new_version!r} is not a PEP 440 version.") from None
    old_version = loaded.recipe.vllm.version
    old_wheel = workspace.locked_wheel(loaded, store)
    new_entry, new_wheel = resolve_wheel(loaded, store, new_version)
    patches = try_series(loaded, old_wheel, new_wheel, (old_version, new_version))
    report = BumpReport(old_version, new_version, new_entry, patches, dry_run)
    if rebase is not None:
        report.rebase = rebase_workspace(loaded, store, rebase, new_version, new_wheel)
    if not dry_run:
        repin(loaded, new_entry)
    report.seconds = time.perf_counter() - t0
    return report


def repin(loaded: LoadedRecipe, entry: lockmod.LockedWheel) -> None:
    """Set ``[vllm] version`` in recipe.toml (layout and comments kept) and lock the wheel."""
    import tomlkit

    from qwen38build.recipe import validate

    text = loaded.path.read_text(encoding="utf-8")
    doc = tomlkit.parse(text)
    doc["vllm"]["version"] = entry.version
    new_text = tomlkit.dumps(doc)
    validate(tomlkit.parse(new_text).unwrap(), loaded.path)
    others = [e for n, e in lockmod.read(loaded.root).items() if n != entry.name]
    tmp = loaded.path.with_name(f".{loaded.path.name}.tmp")
    tmp.write_text(new_text, encoding="utf-8")
    tmp.replace(loaded.path)
    lockmod.write(loaded.root, [*others, entry])


# -- rebase -----------------------------------------------------------------------------


def rebase_workspace(
    loaded: LoadedRecipe, store: Store, repo: Path, new_version: str, new_wheel: Path
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
    # One range, so that git's sequencer carries the rest after `cherry-pick --continue`.
    proc = subprocess.run(
        ["git", "-c", "merge.conflictStyle=diff3", "cherry-pick", "--keep-redundant-commits",
         "--allow-empty", f"{old_tag}..{old_head}"],
        cwd=repo, capture_output=True, text=True, env=workspace.git_env(), check=False,
    )
    done: list[str] = []
    empty: list[str] = []
    for c in workspace.read_commits(repo, f"{new_tag}..HEAD"):
        topic = c.subject.removeprefix(workspace.SUBJECT_PREFIX)
        done.append(topic)
        parent_tree = git(repo, "rev-parse", f"{c.parent}^{{tree}}").strip() if c.parent else ""
        if parent_tree == c.tree:
            empty.append(topic)
    if proc.returncode == 0:
        return RebaseResult(str(repo), branch, tuple(done), tuple(empty))
    stuck = git(repo, "log", "-1", "--format=%s", "CHERRY_PICK_HEAD", check=False).strip()
    files = git(repo, "diff", "--name-only", "--diff-filter=U").split()
    return RebaseResult(
        str(repo), branch, tuple(done), tuple(empty),
        stuck.removeprefix(workspace.SUBJECT_PREFIX) or "(see git status)",
        tuple(files) or ("(see git status)",),
    )
