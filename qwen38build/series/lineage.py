"""The touched files with a series applied, each line knowing which patch brought it in.

The lint attributes an environment read to the patch whose added lines hold it, checks a
diff's ``index`` line against the file as the earlier patches left it, and bump asks whether
a failing hunk's context stands on lines an earlier patch added. All three need the same
thing: the small tree of touched files, patched in series order with GNU patch (the
definition of "applies"), with the origin of every line kept along the way.

A patch that does not apply is skipped (its files are put back as they were) and listed
in :attr:`Lineage.failed`; the build reports it, this module only must not guess.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import NamedTuple

from qwen38build.series.diff import FileDiff
from qwen38build.series.gnupatch import run_patch
from qwen38build.series.patchfile import PatchFile
from qwen38build.wheels.wheelzip import open_wheel


class Origin(NamedTuple):
    """Where a line of the patched tree comes from (a named tuple: one is made per line of
    every touched file, and a frozen dataclass costs several times as much to make).

    ``patch`` is the series index of the patch that added it, or None for a line of the
    pristine file. ``line`` is then the 1-based line in that patch file (added) or in the
    pristine file (pristine).
    """

    patch: int | None
    line: int


def split_lines(data: bytes | None) -> list[str]:
    """A file's lines as the patch sees them (``\\n``-split; the last may be empty)."""
    if data is None:
        return []
    return data.decode("utf-8", "surrogateescape").split("\n")


def from_wheel(root: Path, wheel: Path, patches: list[PatchFile],
               package: str = "vllm") -> Lineage:
    """The lineage of every file ``patches`` touch, read from the pristine ``wheel`` and
    advanced through the whole series (in ``root``, which the caller cleans up)."""
    z = open_wheel(wheel)
    names = set(z.namelist())
    rels = sorted({rel for pf in patches for rel in pf.touched_paths})
    files = {
        rel: z.read(f"{package}/{rel}") if f"{package}/{rel}" in names else None
        for rel in rels
    }
    lineage = Lineage(root, files, patches)
    lineage.advance_to(len(patches))
    return lineage


class Lineage:
    """The files ``files`` (package-relative → bytes, None where absent), advanced patch by
    patch through ``patches``.

    Kept in memory: a patch whose every hunk is found exactly (fuzz 0, the match nearest
    to where the hunk says, as GNU patch places it) is applied here, line origins and all,
    without a process or a file. Anything else (a hunk not found, a rename, a missing
    newline at the end, a binary diff) goes to GNU patch in ``root``, which decides.
    """

    def __init__(self, root: Path, files: dict[str, bytes | None],
                 patches: list[PatchFile]) -> None:
        self.root = root
        self.patches = patches
        self.next = 0
        self.failed: list[int] = []
        # The touched files' bytes just before each patch was tried, and just after it
        # applied (a patch that failed has no after), by series index.
        self.before: dict[int, dict[str, bytes | None]] = {}
        self.after: dict[int, dict[str, bytes | None]] = {}
        self.data: dict[str, bytes | None] = dict(files)
        self.text: dict[str, list[str]] = {}
        self.origin: dict[str, list[Origin]] = {}
        for rel, data in files.items():
            lines = split_lines(data)
            self.text[rel] = lines
            self.origin[rel] = [Origin(None, i + 1) for i in range(len(lines))]

    def advance_to(self, k: int) -> None:
        """Apply the patches before index ``k`` that are not applied yet."""
        while self.next < k:
            self._apply(self.next)
            if self.next not in self.failed:
                rels = self.patches[self.next].touched_paths
                self.after[self.next] = {rel: self.data.get(rel) for rel in rels}
            self.next += 1

    def _apply(self, j: int) -> None:
        pf = self.patches[j]
        rels = pf.touched_paths
        self.before[j] = {rel: self.data.get(rel) for rel in rels}
        done = _in_memory(pf, j, self.text, self.origin, self.data)
        if done is not None:
            for rel, (lines, origin) in done.items():
                self.text[rel], self.origin[rel] = lines, origin
                self.data[rel] = "\n".join(lines).encode("utf-8", "surrogateescape")
            return
        self._with_gnu_patch(j, pf, rels)

    def _with_gnu_patch(self, j: int, pf: PatchFile, rels: list[str]) -> None:
        for rel in rels:
            p = self.root / rel
            data = self.data.get(rel)
            if data is None:
                p.unlink(missing_ok=True)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
        if not run_patch(pf.path, self.root).ok:
            self.failed.append(j)  # the files in memory are as they were
            return
        for fd in pf.files:
            for rel in dict.fromkeys(r for r in (fd.old_path, fd.new_path) if r):
                try:
                    new = (self.root / rel).read_bytes()
                except FileNotFoundError:
                    new = None
                lines = split_lines(new)
                if rel == fd.new_path:
                    self.origin[rel] = _carry(self.text.get(rel, []), lines,
                                              self.origin.get(rel, []), fd, j)
                else:
                    self.origin[rel] = [Origin(None, i + 1) for i in range(len(lines))]
                self.text[rel] = lines
                self.data[rel] = new


def _in_memory(
    pf: PatchFile, j: int, text: dict[str, list[str]], origin: dict[str, list[Origin]],
    data: dict[str, bytes | None],
) -> dict[str, tuple[list[str], list[Origin]]] | None:
    """Patch ``j`` applied to the texts, each file's new lines and origins; None when it
    cannot be done exactly here (GNU patch then decides)."""
    out: dict[str, tuple[list[str], list[Origin]]] = {}
    for fd in pf.files:
        if fd.binary or (fd.old_path != fd.new_path and None not in (fd.old_path, fd.new_path)):
            return None
        if any(ln.startswith("\\") for h in fd.hunks for ln in h.lines):
            return None  # "\ No newline at end of file": GNU patch's business
        rel = fd.path
        if rel in out:
            return None  # two diffs of one file in one patch
        if fd.old_path is None:  # a new file
            if data.get(rel) is not None or len(fd.hunks) != 1:
                return None
            (h,) = fd.hunks
            out[rel] = ([*h.new_lines, ""],
                        [Origin(j, h.patch_line + 1 + i) for i in range(len(h.lines))] +
                        [Origin(j, h.patch_line + len(h.lines))])
            continue
        if data.get(rel) is None or fd.new_path is None:
            return None  # a deletion, or a file that is not there: GNU patch says
        placed = _place(text[rel], origin[rel], fd, j)
        if placed is None:
            return None
        out[rel] = placed
    return out


def _place(old: list[str], origin: list[Origin], fd: FileDiff, j: int
           ) -> tuple[list[str], list[Origin]] | None:
    """``fd``'s hunks applied to ``old`` at fuzz 0, or None where one is not found."""
    lines: list[str] = []
    out: list[Origin] = []
    pos = 0
    delta = 0
    for h in fd.hunks:
        want = h.old_lines
        guess = h.old_start - 1 + delta if h.old_count else h.old_start + delta
        at = _nearest(old, want, guess, pos) if want else guess
        if at is None or not pos <= at <= len(old):
            return None
        lines += old[pos:at]
        out += origin[pos:at]
        pos = at
        for i, ln in enumerate(h.lines):
            tag = ln[:1]
            if tag == " ":
                lines.append(old[pos])
                out.append(origin[pos])
                pos += 1
            elif tag == "-":
                pos += 1
            elif tag == "+":
                lines.append(ln[1:])
                out.append(Origin(j, h.patch_line + 1 + i))
        # GNU patch expects the next hunk at its own line moved by this one's offset.
        delta = at - (h.old_start - 1 if h.old_count else h.old_start)
    lines += old[pos:]
    out += origin[pos:]
    return lines, out


def _carry(old: list[str], new: list[str], origin: list[Origin], fd: FileDiff,
           j: int) -> list[Origin]:
    """The origins of ``new`` after patch ``j`` (GNU patch) changed ``old`` by ``fd``.

    Exact where the hunks can be placed as :func:`_place` does and give ``new``; else a
    difflib alignment, the added lines then named by their text.
    """
    placed = _place(old, origin, fd, j)
    if placed is not None and placed[0] == new:
        return placed[1]
    added: dict[str, list[int]] = {}
    for h in fd.hunks:
        for line, text in h.added():
            added.setdefault(text, []).append(line)
    out: list[Origin] = []
    sm = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out += origin[i1:i2]
        else:
            for text in new[j1:j2]:
                lines = added.get(text) or [fd.patch_line]
                out.append(Origin(j, lines.pop(0) if len(lines) > 1 else lines[0]))
    return out


def _nearest(have: list[str], want: list[str], guess: int, lo: int) -> int | None:
    """0-based start of ``want`` in ``have`` at or after ``lo``, nearest to ``guess``."""
    n = len(want)
    first = want[0]
    hits = [i for i in range(lo, len(have) - n + 1)
            if have[i] == first and have[i:i + n] == want]
    return min(hits, key=lambda i: abs(i - guess)) if hits else None
