"""A patch's git diff: files and hunks, parsed strictly (no links, modes, binaries, escapes)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from qwen38build.errors import PatchFileError

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
REGENERATE = "regenerate the patch with qwen38build export; do not edit diffs by hand"




@dataclass(frozen=True)
class Problem:
    """A structural problem found while parsing, at a 1-based line of the patch file.

    ``rule`` names the lint rule it belongs to (``headers`` or ``diff-hygiene``); ``fatal``
    problems make a strict parse raise, the others only the lint report.
    """

    line: int
    rule: str
    message: str
    hint: str
    fatal: bool = True


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` hunk: its place in the target file and its lines, as in the diff."""

    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[str, ...]  # each line with its leading ' ', '-', '+' or '\\'
    patch_line: int  # 1-based line of the ``@@`` header in the patch file

    @property
    def old_lines(self) -> list[str]:
        """The lines the hunk expects in the target file (context and removals)."""
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "-")]

    @property
    def new_lines(self) -> list[str]:
        """The lines the hunk leaves in the target file (context and additions)."""
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "+")]

    def added(self) -> list[tuple[int, str]]:
        """Each added line (without its ``+``) with its 1-based line in the patch file."""
        return [
            (self.patch_line + 1 + k, ln[1:])
            for k, ln in enumerate(self.lines)
            if ln.startswith("+")
        ]


@dataclass(frozen=True)
class FileDiff:
    """The diff of one file. Paths are relative to the package; None means /dev/null."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    binary: bool
    patch_line: int  # 1-based line where this file's diff starts

    @property
    def path(self) -> str:
        """The file this diff is about (the new path, or the old one for a deletion)."""
        p = self.new_path or self.old_path
        assert p is not None
        return p


def first_diff_line(lines: list[str]) -> int:
    for i, ln in enumerate(lines):
        if ln.startswith(("diff --git ", "--- a/", "--- /dev/null")):
            return i
    return len(lines)


def _package_path(raw: str, *, line: int, problems: list[Problem]) -> str | None:
    """Turn ``a/x/y.py`` into ``x/y.py``; a path that leaves the package is a problem."""
    raw = raw.removesuffix("\r").split("\t", 1)[0]
    if raw == "/dev/null":
        return None
    if raw.startswith(("a/", "b/")):
        rel = raw[2:]
    else:
        problems.append(Problem(
            line, "diff-hygiene",
            f"diff path {raw!r} has no a/ or b/ prefix; the series is applied with -p1 "
            "from inside the vllm/ package.",
            REGENERATE,
        ))
        return raw
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not rel or "\\" in rel or "\0" in rel:
        problems.append(Problem(
            line, "diff-hygiene", f"diff path {raw!r} leaves the vllm/ package.",
            "paths must be relative to the vllm/ package (a/<path>, b/<path>), without '..'",
        ))
        return rel
    if p.name == "RECORD" or any(part.endswith(".dist-info") for part in p.parts):
        # The wheel step writes the dist-info and its RECORD; a file named RECORD is read as
        # wheel metadata wherever it lies, so the series may not carry one.
        problems.append(Problem(
            line, "diff-hygiene",
            f"diff path {raw!r} is wheel metadata (a RECORD or a .dist-info file); the "
            "wheel step writes those, the series changes the package only.",
            "drop that file from the topic's commit and re-export",
        ))
        return rel
    return str(p)


def parse_diff(lines: list[str], *, path: Path, first_line: int) -> tuple[FileDiff, ...]:
    """Parse the unified (git) diff part of a patch file into per-file diffs."""
    problems: list[Problem] = []
    files = parse_diff_collecting(lines, first_line=first_line, problems=problems)
    fatal = [p for p in problems if p.fatal]
    if fatal:
        raise PatchFileError(
            "\n".join(f"{path}:{p.line}: {p.message}" for p in fatal), hint=fatal[0].hint
        )
    return files


def _is_diff_start(line: str) -> bool:
    return line.startswith(("diff --git ", "--- ", "Binary files "))


# The only file modes a patch may give: a regular file, executable or not. A link
# (120000) would make the wheel carry whatever the build machine's path holds; a gitlink
# (160000) names another repository. Executable bits, explicitly: a patched file keeps the
# mode of its pristine wheel member (100755 in an index line only states that mode); a mode
# change is refused, as the wheel step writes every member's mode from the pristine wheel
# and would silently drop it; and a new file must be 100644, as the wheel writes the
# members the series adds 0644 (new file mode 100755 is refused for the same reason).
_MODES = ("100644", "100755")
_MODE_LINE_RE = re.compile(
    r"^(?P<key>new file mode|deleted file mode|old mode|new mode|index [0-9a-f]+\.\.[0-9a-f]+)"
    r" (?P<mode>\d+)\s*$"
)


_BINARY_RE = re.compile(r"^Binary files (?P<old>\S+) and (?P<new>\S+) differ$")
_RENAME_RE = re.compile(r"^(?:rename|copy) (?:from|to) (?P<path>.*)$")


def _mode_problem(raw: str, *, line: int, problems: list[Problem]) -> None:
    """A git header line that gives a mode other than a regular file's, or a rename or
    copy whose path leaves the package."""
    r = _RENAME_RE.match(raw.removesuffix("\r"))
    if r is not None:
        _package_path("a/" + r.group("path"), line=line, problems=problems)
        return
    m = _MODE_LINE_RE.match(raw.removesuffix("\r"))
    if m is None:
        return
    key, mode = m.group("key"), m.group("mode")
    if key == "new file mode" and mode == "100755":
        problems.append(Problem(
            line, "diff-hygiene",
            "a new executable file (new file mode 100755); the wheel writes a file the "
            "series adds as 0644, so its executable bit would be lost.",
            "add it as a regular file (100644): the vllm package runs nothing by its mode",
        ))
    elif key in ("old mode", "new mode"):
        problems.append(Problem(
            line, "diff-hygiene",
            f"a mode change ({key} {mode}); the series may change file contents only.",
            "drop the mode change from the topic's commit and re-export",
        ))
    elif mode not in _MODES:
        what = {"120000": "a symbolic link", "160000": "a gitlink (submodule)"}.get(
            mode, f"mode {mode}")
        problems.append(Problem(
            line, "diff-hygiene",
            f"{what} ({raw.strip()}); only regular files (100644, 100755) may be patched.",
            "make it a regular file in the topic's commit and re-export",
        ))


def parse_diff_collecting(  # the problems are collected, for PatchFile.parse(strict=False)
    lines: list[str], *, first_line: int, problems: list[Problem]
) -> tuple[FileDiff, ...]:
    if lines and lines[-1] == "":
        lines = lines[:-1]  # the text's final newline ends the last line; it is not a line
    files: list[FileDiff] = []
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if not _is_diff_start(line):
            i += 1
            continue
        start = i
        binary = False
        old: str | None = None
        new: str | None = None
        if line.startswith("diff --git "):
            i += 1
            while i < n and not lines[i].startswith(("--- ", "diff --git ", "@@")):
                if lines[i].startswith(("Binary files", "GIT binary patch")):
                    binary = True
                _mode_problem(lines[i], line=first_line + i, problems=problems)
                i += 1
        elif line.startswith(("Binary files", "GIT binary patch")):
            binary = True
            i += 1  # past it: the trailer's skip stops at the next diff start
        if i < n and lines[i].startswith("--- "):
            old = _package_path(lines[i][4:], line=first_line + i, problems=problems)
            i += 1
            if i >= n or not lines[i].startswith("+++ "):
                problems.append(Problem(
                    first_line + i, "diff-hygiene",
                    "a '---' line without its '+++' line.", REGENERATE,
                ))
                continue
            new = _package_path(lines[i][4:], line=first_line + i, problems=problems)
            i += 1
        elif not binary:
            # A git header with no content change (mode only) still names its file.
            parts = lines[start].removesuffix("\r").split(" ")
            old = new = _package_path(parts[-1], line=first_line + start, problems=problems)
        else:
            bare = _BINARY_RE.match(lines[start].removesuffix("\r"))
            parts = lines[start].removesuffix("\r").split(" ")
            raw = bare.group("new") if bare else parts[-1]
            new = _package_path(raw, line=first_line + start, problems=problems)
        hunks: list[Hunk] = []
        while i < n and lines[i].startswith("@@"):
            hunk, i = _parse_hunk(lines, i, first_line=first_line, problems=problems)
            if hunk is not None:
                hunks.append(hunk)
        if binary:
            problems.append(Problem(
                first_line + start, "diff-hygiene",
                f"{new or old} is a binary diff; GNU patch cannot apply it at fuzz 0.",
                "carry text diffs only; a binary belongs in a build step, not in the series",
            ))
        files.append(FileDiff(old, new, tuple(hunks), binary, patch_line=first_line + start))
        i = _skip_trailer(lines, i, hunks, first_line=first_line, problems=problems)
    return tuple(files)


def _skip_trailer(
    lines: list[str], i: int, hunks: list[Hunk], *, first_line: int, problems: list[Problem]
) -> int:
    """Skip to the next file's diff; lines in between that no hunk counted are a problem.

    A hunk whose header counts fewer lines than it has ends early, and the rest of its lines
    would be silently dropped by a reader that trusts the header. Blank lines at the end of
    the file and a ``-- `` signature (git format-patch) are fine.
    """
    j = i
    n = len(lines)
    while j < n and not _is_diff_start(lines[j]):
        if lines[j] in ("-- ", "--"):
            return n
        j += 1
    stray = [k for k in range(i, j) if lines[k].strip()]
    if stray and hunks:
        h = hunks[-1]
        problems.append(Problem(
            h.patch_line, "diff-hygiene",
            f"hunk header says -{h.old_count} +{h.new_count} lines but the hunk goes on past "
            f"them (line {first_line + stray[0]} is not counted).",
            REGENERATE,
        ))
    elif stray:
        problems.append(Problem(
            first_line + stray[0], "diff-hygiene",
            f"line {lines[stray[0]]!r} belongs to no hunk.", REGENERATE,
        ))
    return j


def _parse_hunk(
    lines: list[str], i: int, *, first_line: int, problems: list[Problem]
) -> tuple[Hunk | None, int]:
    m = HUNK_RE.match(lines[i])
    if not m:
        problems.append(Problem(
            first_line + i, "diff-hygiene", f"unreadable hunk header {lines[i]!r}.",
            REGENERATE,
        ))
        return None, i + 1
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_count = int(m.group(2)) if m.group(2) is not None else 1
    new_count = int(m.group(4)) if m.group(4) is not None else 1
    header_i = i
    i += 1
    body: list[str] = []
    seen_old = seen_new = 0
    while i < len(lines) and (seen_old < old_count or seen_new < new_count):
        ln = lines[i]
        tag = ln[:1]
        if tag == " " or ln == "":
            seen_old += 1
            seen_new += 1
            ln = ln or " "
        elif tag == "-":
            seen_old += 1
        elif tag == "+":
            seen_new += 1
        elif tag != "\\":
            break
        body.append(ln)
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        body.append(lines[i])
        i += 1
    if seen_old != old_count or seen_new != new_count:
        problems.append(Problem(
            first_line + header_i, "diff-hygiene",
            f"hunk header says -{old_count} +{new_count} lines but the hunk has "
            f"-{seen_old} +{seen_new}.",
            REGENERATE,
        ))
    hunk = Hunk(old_start, old_count, new_start, new_count, tuple(body), first_line + header_i)
    return hunk, i
