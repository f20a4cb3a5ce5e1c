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
from pathlib import Path

from qwen38build.errors import PatchFileError
from qwen38build.series.diff import FileDiff, Problem, first_diff_line, parse_diff_collecting
from qwen38build.series.headers import format_headers, is_blank, parse_header_block, split_preamble

REQUIRED_HEADERS = ("Kind", "What", "Upstream", "Cut-against", "Retires-when")
KINDS = ("backport", "fix", "feature", "local", "own")
MARKER_PREFIX = "--- exported from "
MARKER_SUFFIX = "; regenerate with qwen38build export, do not edit ---"
_MARKER_RE = re.compile(r"^--- exported from (?P<commit>\S+) \((?P<topic>[^)]*)\)")


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
        diff_start = marker_idx + 1 if marker_idx is not None else first_diff_line(lines)
        preamble = [
            ln.removesuffix("\r")
            for ln in lines[: marker_idx if marker_idx is not None else diff_start]
        ]
        prose_lines, header_block, header_offset = split_preamble(preamble)
        headers, header_lines = parse_header_block(
            header_block, first_line=header_offset + 1, problems=problems
        )
        marker = lines[marker_idx].removesuffix("\r") if marker_idx is not None else None
        m = _MARKER_RE.match(marker) if marker else None
        diff_lines = lines[diff_start:]
        files = parse_diff_collecting(diff_lines, first_line=diff_start + 1, problems=problems)
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
        if not is_blank(self.prose.replace("\n", "")):
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


