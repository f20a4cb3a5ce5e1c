"""One model of a patch file, used by the build, the table, the lint and the bump report.

A patch file is, in order: prose; a blank line; a header block (``Kind:``, ``What:``,
``Upstream:``, ``Cut-against:``, ``Retires-when:`` and any other ``Key:`` lines, a long value
continuing on lines that start with spaces); the marker line
``--- exported from <sha> (<topic>); ...``; then a git diff whose paths are relative to the
``vllm/`` package.

Parsing never fails on content it does not understand in the prose. Every structural problem
(a path leaving the package, a hunk header it cannot read or whose counts are wrong, a header
given twice) is collected as a :class:`Problem` with its line; ``parse`` then raises them all
at once as one :class:`PatchFileError`, because the build could do the wrong thing with such
a file. ``parse(..., strict=False)`` keeps them on the model instead, so that the lint can
report each one as a finding beside its other rules.

:meth:`PatchFile.format` writes the model back. For a file in the canonical layout (the one
``qwen38build export`` writes) ``PatchFile.parse(p).format()`` gives the file's text back;
for any headers, format → parse → format is the identity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from qwen38build.errors import PatchFileError

REQUIRED_HEADERS = ("Kind", "What", "Upstream", "Cut-against", "Retires-when")
KINDS = ("backport", "fix", "feature", "local", "own")
MARKER_PREFIX = "--- exported from "
MARKER_SUFFIX = "; regenerate with qwen38build export, do not edit ---"
_MARKER_RE = re.compile(r"^--- exported from (?P<commit>\S+) \((?P<topic>[^)]*)\)")
_HEADER_RE = re.compile(r"^(?P<key>[A-Z][A-Za-z0-9-]*):(?: (?P<value>.*))?$")
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_REGENERATE = "regenerate the patch with qwen38build export; do not edit diffs by hand"


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


@dataclass(frozen=True)
class PatchFile:
    """A parsed patch file. ``headers`` keeps every header, in file order.

    A header value keeps its continuation lines joined with ``"\\n"`` (without their
    indentation); :func:`header_text` gives the one-line form the ledger shows.
    """

    path: Path
    topic: str
    prose: str
    headers: dict[str, str]
    header_line: int  # 1-based line of the first header, 0 when there are none
    marker: str | None
    marker_line: int  # 1-based, 0 when there is no marker
    marker_commit: str | None
    marker_topic: str | None
    diff: str
    files: tuple[FileDiff, ...] = field(default=())
    problems: tuple[Problem, ...] = field(default=())
    header_lines: dict[str, int] = field(default_factory=dict)  # key -> 1-based line

    @classmethod
    def parse(cls, path: Path, text: str | None = None, *, strict: bool = True) -> PatchFile:
        """Parse ``path`` (or ``text`` as if read from it).

        The file is read as bytes and decoded, so a CRLF stays visible to the lint. With
        ``strict`` (the default) every fatal problem is raised at once as PatchFileError.
        """
        if text is None:
            try:
                text = path.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PatchFileError(f"{path}: cannot read the patch file: {exc}.") from exc
        problems: list[Problem] = []
        if "\0" in text:
            problems.append(Problem(
                text.count("\n", 0, text.index("\0")) + 1, "diff-hygiene",
                "a NUL byte; a patch file is text.",
                "regenerate the patch with qwen38build export; carry text diffs only",
            ))
        lines = text.split("\n")
        marker_idx = next(
            (i for i, ln in enumerate(lines) if ln.startswith(MARKER_PREFIX)), None
        )
        diff_start = marker_idx + 1 if marker_idx is not None else _first_diff_line(lines)
        preamble = [
            ln.removesuffix("\r")
            for ln in lines[: marker_idx if marker_idx is not None else diff_start]
        ]
        prose_lines, header_block, header_offset = _split_preamble(preamble)
        headers, header_lines = _parse_header_block(
            header_block, first_line=header_offset + 1, problems=problems
        )
        marker = lines[marker_idx].removesuffix("\r") if marker_idx is not None else None
        m = _MARKER_RE.match(marker) if marker else None
        diff_lines = lines[diff_start:]
        files = _parse_diff(diff_lines, first_line=diff_start + 1, problems=problems)
        pf = cls(
            path=path,
            topic=topic_of(path),
            prose="\n".join(prose_lines).rstrip("\n"),
            headers=headers,
            header_line=header_offset + 1 if header_block else 0,
            marker=marker,
            marker_line=marker_idx + 1 if marker_idx is not None else 0,
            marker_commit=m.group("commit") if m else None,
            marker_topic=m.group("topic") if m else None,
            diff="\n".join(diff_lines),
            files=files,
            problems=tuple(problems),
            header_lines=header_lines,
        )
        fatal = [p for p in problems if p.fatal]
        if strict and fatal:
            text_ = "\n".join(f"{path}:{p.line}: {p.message}" for p in fatal)
            raise PatchFileError(text_, hint=fatal[0].hint)
        return pf

    @property
    def touched_paths(self) -> list[str]:
        """Every package-relative path this patch reads or writes, in diff order."""
        seen: dict[str, None] = {}
        for f in self.files:
            for p in (f.old_path, f.new_path):
                if p is not None:
                    seen.setdefault(p, None)
        return list(seen)

    def format(self) -> str:
        """The file's text in the canonical layout: prose, blank line, headers, marker, diff.

        The prose and its blank line are left out when there is no prose; the headers are
        written by :func:`format_headers`; the diff is written as it was read.
        """
        parts: list[str] = []
        if not _is_blank(self.prose.replace("\n", "")):
            parts.append(self.prose.rstrip("\n") + "\n\n")
        if self.headers:
            parts.append(format_headers(self.headers) + "\n")
        if self.marker is not None:
            parts.append(self.marker + "\n")
        parts.append(self.diff)
        return "".join(parts)


def topic_of(path: Path) -> str:
    """The topic a patch file carries: its file name without ``.patch``."""
    name = path.name
    return name[: -len(".patch")] if name.endswith(".patch") else name


def marker_for(commit: str, topic: str) -> str:
    """The marker line ``qwen38build export`` writes for ``commit`` and ``topic``."""
    return f"{MARKER_PREFIX}{commit} ({topic}){MARKER_SUFFIX}"


def header_text(value: str) -> str:
    """A header value on one line: its continuation lines joined with one space."""
    return " ".join(part for part in (p.strip(" ") for p in value.split("\n")) if part)


def _value_lines(value: str) -> list[str]:
    """A value as the lines ``format_headers`` writes: no padding, no empty continuation.

    Anything that splits a line (``\\r``, a newline) becomes a line break, so that the text
    read back is the text written.
    """
    first, *rest = value.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    cont = [ln.strip(" ") for ln in rest]
    return [first.rstrip(" "), *(ln for ln in cont if not _is_blank(ln))]


def format_headers(headers: dict[str, str]) -> str:
    """Write headers back; a multi-line value continues on lines indented by two spaces.

    Values are normalised on the way out (trailing spaces, empty or indented continuation
    lines), so format → parse → format is the identity for any value.
    """
    out = []
    for key, value in headers.items():
        first, *rest = _value_lines(value)
        out.append(f"{key}: {first}" if first else f"{key}:")
        out.extend(f"  {ln}" for ln in rest)
    return "\n".join(out)


def parse_headers(lines: list[str], *, path: Path, first_line: int) -> dict[str, str]:
    """Parse a header block; continuation lines (leading spaces) join with a newline."""
    problems: list[Problem] = []
    headers, _ = _parse_header_block(lines, first_line=first_line, problems=problems)
    if problems:
        p = problems[0]
        raise PatchFileError(f"{path}:{p.line}: {p.message}", hint=p.hint)
    return headers


def _is_blank(line: str) -> bool:
    """Blank means spaces and tabs only; other whitespace is content (a value may hold it)."""
    return not line.strip(" \t")


def _is_continuation(line: str) -> bool:
    return line.startswith(" ") and not _is_blank(line)


def _parse_header_block(
    lines: list[str], *, first_line: int, problems: list[Problem]
) -> tuple[dict[str, str], dict[str, int]]:
    headers: dict[str, str] = {}
    where: dict[str, int] = {}
    key: str | None = None
    for i, line in enumerate(lines):
        m = _HEADER_RE.match(line)
        if m and not line.startswith(" "):
            key = m.group("key")
            if key in headers:
                problems.append(Problem(
                    first_line + i, "headers",
                    f"header {key!r} appears twice (first at line {where[key]}).",
                    "keep one; regenerate the file with qwen38build export",
                ))
                key = None  # the first value stands; continuations of the second are dropped
                continue
            headers[key] = m.group("value") or ""
            where[key] = first_line + i
        elif _is_continuation(line) and key is not None:
            headers[key] += "\n" + line.lstrip(" ")
        elif _is_continuation(line):
            continue  # a continuation of a duplicate header
        else:
            problems.append(Problem(
                first_line + i, "headers", f"not a header line: {line!r}.",
                "write headers as 'Key: value', continuation lines indented by spaces",
            ))
    return headers, where


def _split_preamble(preamble: list[str]) -> tuple[list[str], list[str], int]:
    """Split the text above the marker into prose and the trailing header block."""
    end = len(preamble)
    while end and _is_blank(preamble[end - 1]):
        end -= 1
    start = end
    while start:
        line = preamble[start - 1]
        if _is_continuation(line) or _HEADER_RE.match(line):
            start -= 1
            continue
        break
    # A block of only continuation lines is prose, not headers.
    while start < end and preamble[start].startswith(" "):
        start += 1
    return preamble[:start], preamble[start:end], start


def _first_diff_line(lines: list[str]) -> int:
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
            _REGENERATE,
        ))
        return raw
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not rel or "\\" in rel or "\0" in rel:
        problems.append(Problem(
            line, "diff-hygiene", f"diff path {raw!r} leaves the vllm/ package.",
            "paths must be relative to the vllm/ package (a/<path>, b/<path>), without '..'",
        ))
        return rel
    return str(p)


def parse_diff(lines: list[str], *, path: Path, first_line: int) -> tuple[FileDiff, ...]:
    """Parse the unified (git) diff part of a patch file into per-file diffs."""
    problems: list[Problem] = []
    files = _parse_diff(lines, first_line=first_line, problems=problems)
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
# (160000) names another repository. A mode change is refused too: the wheel step writes
# every member's mode from the pristine wheel, so it would be silently dropped.
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
    if key in ("old mode", "new mode"):
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


def _parse_diff(
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
                    "a '---' line without its '+++' line.", _REGENERATE,
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
            _REGENERATE,
        ))
    elif stray:
        problems.append(Problem(
            first_line + stray[0], "diff-hygiene",
            f"line {lines[stray[0]]!r} belongs to no hunk.", _REGENERATE,
        ))
    return j


def _parse_hunk(
    lines: list[str], i: int, *, first_line: int, problems: list[Problem]
) -> tuple[Hunk | None, int]:
    m = HUNK_RE.match(lines[i])
    if not m:
        problems.append(Problem(
            first_line + i, "diff-hygiene", f"unreadable hunk header {lines[i]!r}.",
            _REGENERATE,
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
            _REGENERATE,
        ))
    hunk = Hunk(old_start, old_count, new_start, new_count, tuple(body), first_line + header_i)
    return hunk, i
