"""Diff hygiene of a file diff's git header: the names it gives, and its ``index`` line.

GNU patch follows the ``---``/``+++`` lines, ``git apply`` the ``diff --git a/X b/Y`` line;
when they disagree (and no ``rename``/``copy`` header says why) the two tools patch
different files, and a reader is misled. The ``index <old>..<new>`` line names the git blob
of the file before the change: where the file before the patch is known (the pristine
wheel plus the earlier patches of the series), a different blob means the patch was cut
against another tree. Mode lines and binary diffs are the diff model's business.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from qwen38build.series.diff import FileDiff
from qwen38build.series.patchfile import PatchFile

_GIT_RE = re.compile(r"^diff --git (?P<a>\S+) (?P<b>\S+)$")
_INDEX_RE = re.compile(r"^index (?P<old>[0-9a-f]{7,64})\.\.(?P<new>[0-9a-f]{7,64})(?: \d+)?$")


@dataclass(frozen=True)
class Header:
    """What the git header of one file diff says; ``*_line`` are 1-based patch-file lines."""

    git_old: str | None  # the a/ name without its prefix, None without a git line
    git_new: str | None
    git_line: int
    renamed_from: str | None
    renamed_to: str | None
    index_old: str | None
    index_line: int
    minus: str | None  # the --- name as written (a/X or /dev/null), None without one
    plus: str | None
    minus_line: int


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes (sha1 of ``blob <size>\\0<bytes>``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def headers(pf: PatchFile, text_lines: list[str]) -> list[tuple[FileDiff, Header]]:
    """The header of each file diff of ``pf``; ``text_lines`` are the patch file's lines."""
    out: list[tuple[FileDiff, Header]] = []
    starts = [fd.patch_line for fd in pf.files] + [len(text_lines) + 1]
    for k, fd in enumerate(pf.files):
        end = fd.hunks[0].patch_line if fd.hunks else starts[k + 1]
        block = [(no, text_lines[no - 1].removesuffix("\r"))
                 for no in range(fd.patch_line, min(end, len(text_lines) + 1))]
        git_old = git_new = renamed_from = renamed_to = index_old = minus = plus = None
        git_line = index_line = minus_line = 0
        for no, line in block:
            if m := _GIT_RE.match(line):
                git_old, git_new, git_line = _strip(m.group("a"), "a/"), \
                    _strip(m.group("b"), "b/"), no
            elif m := _INDEX_RE.match(line):
                index_old, index_line = m.group("old"), no
            elif line.startswith(("rename from ", "copy from ")):
                renamed_from = line.split(" from ", 1)[1]
            elif line.startswith(("rename to ", "copy to ")):
                renamed_to = line.split(" to ", 1)[1]
            elif line.startswith("--- "):
                minus, minus_line = line[4:].split("\t", 1)[0], no
            elif line.startswith("+++ "):
                plus = line[4:].split("\t", 1)[0]
        out.append((fd, Header(git_old, git_new, git_line, renamed_from, renamed_to,
                               index_old, index_line, minus, plus, minus_line)))
    return out


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


def name_mismatch(h: Header) -> str | None:
    """Why the ``diff --git`` names and the ``---``/``+++`` names disagree, or None."""
    if h.git_old is None or h.git_new is None:
        return None
    if h.renamed_from is not None or h.renamed_to is not None:
        if (h.renamed_from, h.renamed_to) != (h.git_old, h.git_new):
            return (f"'diff --git' names {h.git_old} → {h.git_new} but the rename/copy "
                    f"lines say {h.renamed_from} → {h.renamed_to}")
    elif h.git_old != h.git_new:
        return (f"'diff --git' names two files ({h.git_old}, {h.git_new}) but no rename or "
                "copy line says the file moved")
    if h.minus is None or h.plus is None:
        return None
    if not (h.minus == "/dev/null" or h.minus.startswith("a/")) or not (
        h.plus == "/dev/null" or h.plus.startswith("b/")
    ):
        return None  # a name without its prefix is a finding of its own (the diff model's)
    minus = None if h.minus == "/dev/null" else _strip(h.minus, "a/")
    plus = None if h.plus == "/dev/null" else _strip(h.plus, "b/")
    if minus not in (None, h.git_old) or plus not in (None, h.git_new):
        return (f"'diff --git' names {h.git_old} but '---'/'+++' name {minus or '/dev/null'}"
                f" and {plus or '/dev/null'}; GNU patch follows the one, git apply the other")
    return None


def index_mismatch(h: Header, before: bytes | None) -> str | None:
    """Why the ``index`` line's pre-image id is not the blob of ``before``, or None."""
    if h.index_old is None:
        return None
    if before is None:
        if set(h.index_old) == {"0"}:
            return None
        return (f"the 'index' line names pre-image {h.index_old}, but the file does not "
                "exist before this patch")
    blob = git_blob_id(before)
    if blob.startswith(h.index_old):
        return None
    return (f"the 'index' line names pre-image {h.index_old}, but the file as pristine vLLM "
            f"and the earlier patches leave it is blob {blob[:len(h.index_old)]}: the patch "
            "was cut against another tree")
