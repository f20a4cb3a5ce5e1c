"""One model of a patch file, used by the build, the table, the lint and the bump report.

A patch file is, in order: prose; a header block (``Kind:``, ``What:``, ``Upstream:``,
``Cut-against:``, ``Retires-when:`` and any other ``Key:`` lines, a long value continuing on
lines that start with spaces); the marker line ``--- exported from <sha> (<topic>); ...``;
then a git diff whose paths are relative to the ``vllm/`` package.

Parsing never fails on content it does not understand in the prose; it fails, naming the
file and line, only where the build could do the wrong thing (a path leaving the package, a
hunk header it cannot read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from qwen38build.errors import PatchFileError

REQUIRED_HEADERS = ("Kind", "What", "Upstream", "Cut-against", "Retires-when")
MARKER_PREFIX = "--- exported from "
_MARKER_RE = re.compile(r"^--- exported from (?P<commit>\S+) \((?P<topic>[^)]*)\)")
_HEADER_RE = re.compile(r"^(?P<key>[A-Z][A-Za-z0-9-]*):(?: (?P<value>.*))?$")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


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
    """A parsed patch file. ``headers`` keeps every header, in file order."""

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

    @classmethod
    def parse(cls, path: Path, text: str | None = None) -> PatchFile:
        """Parse ``path`` (or ``text`` as if read from it)."""
        if text is None:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PatchFileError(f"{path}: cannot read the patch file: {exc}.") from exc
        lines = text.split("\n")
        marker_idx = next(
            (i for i, ln in enumerate(lines) if ln.startswith(MARKER_PREFIX)), None
        )
        diff_start = marker_idx + 1 if marker_idx is not None else _first_diff_line(lines)
        preamble = lines[: marker_idx if marker_idx is not None else diff_start]
        prose_lines, header_lines, header_offset = _split_preamble(preamble)
        headers = parse_headers(header_lines, path=path, first_line=header_offset + 1)
        marker = lines[marker_idx] if marker_idx is not None else None
        m = _MARKER_RE.match(marker) if marker else None
        diff_lines = lines[diff_start:]
        return cls(
            path=path,
            topic=topic_of(path),
            prose="\n".join(prose_lines).rstrip("\n"),
            headers=headers,
            header_line=header_offset + 1 if header_lines else 0,
            marker=marker,
            marker_line=marker_idx + 1 if marker_idx is not None else 0,
            marker_commit=m.group("commit") if m else None,
            marker_topic=m.group("topic") if m else None,
            diff="\n".join(diff_lines),
            files=parse_diff(diff_lines, path=path, first_line=diff_start + 1),
        )

    @property
    def touched_paths(self) -> list[str]:
        """Every package-relative path this patch reads or writes, in diff order."""
        seen: dict[str, None] = {}
        for f in self.files:
            for p in (f.old_path, f.new_path):
                if p is not None:
                    seen.setdefault(p, None)
        return list(seen)


def topic_of(path: Path) -> str:
    """The topic a patch file carries: its file name without ``.patch``."""
    name = path.name
    return name[: -len(".patch")] if name.endswith(".patch") else name


def format_headers(headers: dict[str, str]) -> str:
    """Write headers back; a multi-line value continues on lines indented by two spaces."""
    out = []
    for key, value in headers.items():
        first, *rest = value.split("\n")
        out.append(f"{key}: {first}".rstrip(" ") if first else f"{key}:")
        out.extend(f"  {ln}" for ln in rest)
    return "\n".join(out)


def parse_headers(lines: list[str], *, path: Path, first_line: int) -> dict[str, str]:
    """Parse a header block; continuation lines (leading spaces) join with a newline."""
    headers: dict[str, str] = {}
    key: str | None = None
    for i, line in enumerate(lines):
        m = _HEADER_RE.match(line)
        if m and not line.startswith(" "):
            key = m.group("key")
            if key in headers:
                raise PatchFileError(
                    f"{path}:{first_line + i}: header {key!r} appears twice.",
                    hint="keep one; regenerate the file with qwen38build export",
                )
            headers[key] = m.group("value") or ""
        elif line.startswith(" ") and key is not None:
            headers[key] += "\n" + line.lstrip(" ")
        else:
            raise PatchFileError(f"{path}:{first_line + i}: not a header line: {line!r}.")
    return headers


def _split_preamble(preamble: list[str]) -> tuple[list[str], list[str], int]:
    """Split the text above the marker into prose and the trailing header block."""
    end = len(preamble)
    while end and not preamble[end - 1].strip():
        end -= 1
    start = end
    while start:
        line = preamble[start - 1]
        if line.startswith(" ") and line.strip():
            start -= 1
            continue
        if _HEADER_RE.match(line):
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


def _package_path(raw: str, *, path: Path, line: int) -> str | None:
    """Turn ``a/x/y.py`` into ``x/y.py``; refuse anything that leaves the package."""
    raw = raw.split("\t", 1)[0]
    if raw == "/dev/null":
        return None
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    else:
        raise PatchFileError(
            f"{path}:{line}: diff path {raw!r} has no a/ or b/ prefix; the series is "
            "applied with -p1 from inside the vllm/ package.",
        )
    p = PurePosixPath(raw)
    if p.is_absolute() or ".." in p.parts or raw.startswith("/") or not raw:
        raise PatchFileError(
            f"{path}:{line}: diff path {raw!r} leaves the vllm/ package.",
            hint="paths must be relative to the vllm/ package, without '..'",
        )
    return str(p)


def parse_diff(lines: list[str], *, path: Path, first_line: int) -> tuple[FileDiff, ...]:
    """Parse the unified (git) diff part of a patch file into per-file diffs."""
    files: list[FileDiff] = []
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if line.startswith("diff --git ") or line.startswith("--- "):
            start = i
            binary = False
            old: str | None = None
            new: str | None = None
            if line.startswith("diff --git "):
                i += 1
                while i < n and not lines[i].startswith(("--- ", "diff --git ", "@@")):
                    if lines[i].startswith(("Binary files", "GIT binary patch")):
                        binary = True
                    i += 1
            if i < n and lines[i].startswith("--- "):
                old = _package_path(lines[i][4:], path=path, line=first_line + i)
                i += 1
                if i >= n or not lines[i].startswith("+++ "):
                    raise PatchFileError(
                        f"{path}:{first_line + i}: a '---' line without its '+++' line."
                    )
                new = _package_path(lines[i][4:], path=path, line=first_line + i)
                i += 1
            elif not binary:
                # A git header with no content change (mode only) still names its file.
                parts = lines[start].split(" ")
                old = new = _package_path(parts[-1], path=path, line=first_line + start)
            hunks: list[Hunk] = []
            while i < n and lines[i].startswith("@@"):
                hunk, i = _parse_hunk(lines, i, path=path, first_line=first_line)
                hunks.append(hunk)
            files.append(
                FileDiff(old, new, tuple(hunks), binary, patch_line=first_line + start)
            )
        else:
            i += 1
    return tuple(files)


def _parse_hunk(
    lines: list[str], i: int, *, path: Path, first_line: int
) -> tuple[Hunk, int]:
    m = _HUNK_RE.match(lines[i])
    if not m:
        raise PatchFileError(f"{path}:{first_line + i}: unreadable hunk header {lines[i]!r}.")
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
        raise PatchFileError(
            f"{path}:{first_line + header_i}: hunk header says -{old_count} +{new_count} "
            f"lines but the hunk has -{seen_old} +{seen_new}.",
            hint="regenerate the patch with qwen38build export; do not edit diffs by hand",
        )
    hunk = Hunk(old_start, old_count, new_start, new_count, tuple(body), first_line + header_i)
    return hunk, i
