"""A patch's header block: Key: value lines (long values continued), parsed and written."""

from __future__ import annotations

import re
from pathlib import Path

from qwen38build.errors import PatchFileError
from qwen38build.series.diff import Problem

_HEADER_RE = re.compile(r"^(?P<key>[A-Z][A-Za-z0-9-]*):(?: (?P<value>.*))?$")




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
    return [first.rstrip(" "), *(ln for ln in cont if not is_blank(ln))]


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
    headers, _ = parse_header_block(lines, first_line=first_line, problems=problems)
    if problems:
        p = problems[0]
        raise PatchFileError(f"{path}:{p.line}: {p.message}", hint=p.hint)
    return headers


def is_blank(line: str) -> bool:
    """Blank means spaces and tabs only; other whitespace is content (a value may hold it)."""
    return not line.strip(" \t")


def _is_continuation(line: str) -> bool:
    return line.startswith(" ") and not is_blank(line)


def parse_header_block(
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


def split_preamble(preamble: list[str]) -> tuple[list[str], list[str], int]:
    """Split the text above the marker into prose and the trailing header block."""
    end = len(preamble)
    while end and is_blank(preamble[end - 1]):
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
