"""Trying the series on the new pin: GNU patch per patch at fuzz 0, each failing hunk explained."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qwen38build.bump import members
from qwen38build.bump.report import (
    FAILED,
    HunkFailure,
    HunkOffset,
    Outcome,
    PatchReport,
)
from qwen38build.inputs.recipe import LoadedRecipe, SeriesEntry
from qwen38build.proc import run
from qwen38build.series import upstreamed
from qwen38build.series.diff import HUNK_RE, FileDiff, Hunk
from qwen38build.series.gnupatch import ApplyResult, run_patch, scratch_parent
from qwen38build.series.lineage import Lineage
from qwen38build.series.patchfile import PatchFile

# -- trees ------------------------------------------------------------------------------


def _read_members(wheel: Path, rels: set[str], cache: Path | None = None
                  ) -> tuple[dict[str, bytes | None], set[str]]:
    """The package files ``rels`` of ``wheel`` (None where absent) and its package paths
    (:mod:`.members`: kept in ``cache`` for the next bump)."""
    return members.read_members(wheel, rels, cache)


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
    hits = []
    i = -1
    try:
        while True:  # list.index finds each candidate first line in C
            i = have.index(first, i + 1, len(have) - n + 1)
            if have[i:i + n] == want:
                hits.append(i)
    except ValueError:
        pass
    return min(hits, key=lambda i: abs(i + 1 - near)) if hits else None


@dataclass
class _GnuFile:
    failed: dict[int, int] = field(default_factory=dict)  # hunk → line tried
    skipped: bool = False  # "Skipping patch": no hunk of this file was tried
    ok: dict[int, tuple[int, int]] = field(default_factory=dict)  # hunk → (line, offset)


def _gnu_by_file(result: ApplyResult) -> dict[str, _GnuFile]:
    """GNU patch's per-hunk results (parsed once, in gnupatch) grouped by file."""
    out: dict[str, _GnuFile] = {}
    for h in result.hunks:
        cur = out.setdefault(h.file, _GnuFile())
        if h.applied:
            cur.ok[h.number] = (h.line, h.offset)
        else:
            cur.failed[h.number] = h.line
    for name in result.skipped:
        out.setdefault(name, _GnuFile()).skipped = True
    return out


def _diff_hunks(old: Path, new: Path, names: dict[str, str]
                ) -> dict[str, list[tuple[int, int, list[str]]]]:
    """The hunks of ``diff -rN -U3 old new`` by file: (old start, old count, lines with the
    @@ line); ``names`` maps each file name in the two folders to the path it stands for.

    One GNU diff for every file, not difflib: on a 3,000-line file with a release's worth
    of changes difflib takes a large part of a second, diff a few milliseconds; and not a
    diff per file: each process costs more than its diff.
    """
    proc = run(["diff", "-rN", "-U3", str(old), str(new)], what="GNU diff",
               hint="install diffutils")
    head = f"diff -rN -U3 {old}/"
    out: dict[str, list[tuple[int, int, list[str]]]] = {}
    hunks: list[tuple[int, int, list[str]]] | None = None
    for line in proc.stdout.split("\n"):
        if line.startswith(head):
            hunks = out.setdefault(names[line[len(head):].split(" ", 1)[0]], [])
        elif hunks is None or (line.startswith(("--- ", "+++ ")) and not hunks):
            continue  # a file's two header lines, before its first hunk
        elif m := HUNK_RE.match(line):
            count = int(m.group(2)) if m.group(2) is not None else 1
            hunks.append((int(m.group(1)), count, [line]))
        elif line.startswith("Binary files "):
            hunks = None
        elif hunks and line:
            hunks[-1][2].append(line)
    return out


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
                 root: Path, read_new: Callable[[set[str]], dict[str, bytes | None]]
                 ) -> None:
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
        self.read_new = read_new  # more files of the new wheel, read when asked
        self._added: dict[str, list[str]] | None = None
        self._where: dict[str, list[tuple[str, int]]] = {}  # a line → (file, index) of each
        self._chain: Lineage | None = None
        self._upstream: dict[str, list[tuple[int, int, list[str]]]] | None = None
        self.outcomes: list[Outcome] = []
        self._split: dict[bytes, list[str]] = {}

    def lines(self, data: bytes | None) -> list[str]:
        """:func:`_lines`, each file's bytes split once (a file is asked for once per
        failing hunk); not to be changed by the caller."""
        if data is None:
            return []
        if data not in self._split:
            self._split[data] = _lines(data)
        return self._split[data]

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
        if _may_reverse(pf, self.work) and run_patch(
                pf.path, self.work, reverse=True, dry_run=True).ok:
            return PatchReport(name, file, "upstreamed")
        failures = self._failures(k, pf, _gnu_by_file(result))
        depends = tuple(dict.fromkeys(d for h in failures for d in h.depends_on))
        if failures and all(h.evidence for h in failures):
            return PatchReport(name, file, "likely-upstreamed", failures=failures)
        if failures and all(h.depends_on for h in failures):
            return PatchReport(name, file, "depends-on-failed", failures=failures,
                               depends_on=depends)
        return PatchReport(name, file, "conflict", failures=failures, depends_on=depends)

    def upstream_hunks(self, rel: str) -> list[tuple[int, int, list[str]]]:
        """The old → new pristine diff of ``rel``; every touched file's, at the first ask,
        by one GNU diff of two flat folders (a file per touched path that changed)."""
        if self._upstream is None:
            sides = (self.tmp / "upstream-old", self.tmp / "upstream-new")
            for d in sides:
                d.mkdir()
            names: dict[str, str] = {}
            for path in sorted(self.old.keys() | self.new.keys()):
                a, b = self.old.get(path), self.new.get(path)
                if a == b:
                    continue
                name = str(len(names))
                names[name] = path
                for d, data in zip(sides, (a, b), strict=True):
                    if data is not None:
                        (d / name).write_bytes(data)
            self._upstream = _diff_hunks(*sides, names) if names else {}
        return self._upstream.get(rel, [])

    def moved_code(self, rel: str, hunk: Hunk) -> str:
        """``path:line`` of a file new upstream that holds the whole old side of ``hunk``
        (three lines at least) where the new ``rel`` no longer does: upstream moved the
        code there (0.33.0 split v1/core/kv_cache_utils.py so); else ""."""
        want = hunk.old_lines
        if sum(1 for ln in want if ln.strip()) < 3 or _find(
                self.lines(self.new.get(rel)), want, hunk.old_start) is not None:
            return ""
        if self._added is None:  # the .py files new upstream, read once, only when asked
            added = {n for n in self.new_names - self.old_names if n.endswith(".py")}
            self._added = {n: _lines(d) for n, d in self.read_new(added).items()}
            keys = {h.old_lines[_key(h.old_lines)] for pf in self.patches for fd in pf.files
                    for h in fd.hunks if h.old_lines}
            for path, lines in sorted(self._added.items()):
                for j, line in enumerate(lines):
                    if line in keys:
                        self._where.setdefault(line, []).append((path, j))
        k = _key(want)
        hits = sorted((path, abs(j - k + 1 - hunk.old_start), j - k)
                      for path, j in self._where.get(want[k], [])
                      if j >= k and self._added[path][j - k:j - k + len(want)] == want)
        return f"{hits[0][0]}:{hits[0][2] + 1}" if hits else ""

    def _moved(self, rel: str) -> list[str]:
        name = rel.rsplit("/", 1)[-1]
        return sorted(
            n for n in self.new_names - self.old_names if n.rsplit("/", 1)[-1] == name
        )

    def _failures(self, k: int, pf: PatchFile, gnu: dict[str, _GnuFile]) -> tuple[HunkFailure, ...]:
        out: list[HunkFailure] = []
        for fd in pf.files:
            have = self.lines(_read(self.work / fd.path)) if fd.old_path else []
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
                have = self.lines(_read(self.work / fd.path))
                own_gone = any(_find(have, run, hunk.old_start) is None
                               for run in _runs(hunk.old_lines, failed))
            olds = [o.line for o in span if o.patch is None]
            if olds:
                lo, hi = min(olds), max(olds)
            else:
                lo, hi = hunk.old_start, hunk.old_start + max(hunk.old_count - 1, 0)
        if not hunk and fd.old_path is None:
            lo, hi = 1, len(self.lines(self.new.get(rel)))
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
        moved = self.moved_code(rel, hunk) if hunk is not None and not likely else ""
        if moved:
            note += (f"; its lines are now in {moved}, a file new in {self.versions[1]}: "
                     "upstream moved the code, so the hunk goes to that file")
        return HunkFailure(
            file=fd.path, hunk=i + 1, patch_line=hunk.patch_line if hunk else fd.patch_line,
            note=note, upstream_diff=upstream, depends_on=tuple(dict.fromkeys(depends)),
            evidence=found.note if found and likely else "",
            similarity=round(found.similarity, 3) if found and uhunks else None,
            side_by_side=found.side_by_side if found and likely else "",
            moved_to=moved,
        )


def _key(lines: list[str]) -> int:
    """The index of the most telling line of ``lines`` (the longest; the first of those)."""
    return max(range(len(lines)), key=lambda i: len(lines[i]))


def _may_reverse(pf: PatchFile, work: Path) -> bool:
    """False when ``pf`` certainly does not reverse-apply at fuzz 0 to the tree in ``work``:
    a hunk's new side (its context and added lines) is nowhere in its file, so GNU patch
    need not be asked. Anything this does not model (a new or deleted file, a rename, a
    binary diff, a missing newline at the end, a file not there, two diffs of one file)
    is left to GNU patch."""
    if len({fd.path for fd in pf.files}) != len(pf.files):
        return True
    for fd in pf.files:
        if fd.binary or fd.old_path != fd.new_path or fd.old_path is None:
            return True
        data = _read(work / fd.path)
        if data is None:
            return True
        have = _lines(data)
        for hunk in fd.hunks:
            if any(ln.startswith("\\") for ln in hunk.lines):
                return True
            if hunk.new_lines and _find(have, hunk.new_lines, hunk.new_start) is None:
                return False
    return True


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
    loaded: LoadedRecipe, old_wheel: Path, new_wheel: Path, versions: tuple[str, str],
    caches: tuple[Path, Path] | None = None,
) -> list[PatchReport]:
    """Classify every series entry against ``new_wheel`` (the old one for context);
    ``caches``: where to keep what is read of each wheel (:mod:`.members`)."""
    entries = loaded.series_entries()
    patches = [PatchFile.parse(e.path) for e in entries]
    touched: set[str] = set()
    for pf in patches:
        touched.update(pf.touched_paths)
    old, old_names = _read_members(old_wheel, touched, caches[0] if caches else None)
    new, new_names = _read_members(new_wheel, touched, caches[1] if caches else None)
    with tempfile.TemporaryDirectory(prefix="q38-bump.", dir=scratch_parent()) as tmp:
        def read_new(rels: set[str]) -> dict[str, bytes | None]:
            return _read_members(new_wheel, rels, caches[1] if caches else None)[0]

        trial = _Trial(Path(tmp), entries, patches, old, new, old_names, new_names, versions,
                       loaded.root, read_new)
        return trial.run()
