"""Has upstream made a failing hunk's change already, in other words? The evidence for it.

A patch that reverse-applies to the new pin is upstream verbatim. Usually it is not
verbatim: a variable renamed, the fix moved or folded into a refactor. Two tests,
either enough, each shown with the two changes side by side:

- **containment**: every line the hunk adds is among the lines the upstream diff of that
  file adds, compared with whitespace removed and quotes unified, string contents
  included: two dict entries with different string keys (``"ours": torch.uint8`` and
  ``"theirs": torch.uint8``) are different lines, whatever their code has in common;
- **similarity**: the hunk's changed lines against upstream's changed lines in the same
  region of the old file, as a :class:`difflib.SequenceMatcher` ratio over the tokens each
  change brings in, at least :data:`THRESHOLD`. Code and string contents are compared
  apart, each as tokens (a string's words are its tokens), and the figure is the lower of
  the two: a change whose strings are not upstream's (another key, another value, another
  message) is not upstream's change, however alike its code.

Why 0.75: the ratio is 2·matches/total tokens. Renaming one identifier that occurs
once or twice in a three-line change keeps it above 0.8;
two different changes to the same lines (the case a maintainer must re-cut) bring in
different tokens, and in the real 0.32.0 → 0.33.0 bump the 19 failing hunks score 0.00 to
0.40. 0.75 sits between, nearer the high side, because a false "likely upstreamed" costs
more (a patch dropped) than a missed one. The ratio is taken over the tokens each change
brings in (see :func:`delta`), not over whole lines, so what a modified line keeps does not
count as agreement.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

from qwen38build.series.diff import Hunk

THRESHOLD = 0.75
_STRING_RE = re.compile(r"""(?P<q>\"\"\"|'''|"|')(?P<body>.*?)(?P=q)""")
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_WIDTH = 56

UpstreamHunk = tuple[int, int, list[str]]  # old start, old count, lines with the @@ line


@dataclass(frozen=True)
class Evidence:
    """Why a failing hunk looks upstreamed: the test that held, its figure, and the two
    changes side by side (ours left, upstream right)."""

    how: str  # "contained", "similar", or "" (no evidence: the figure only)
    similarity: float
    note: str
    side_by_side: str

    @property
    def likely(self) -> bool:
        return bool(self.how)


@functools.lru_cache(maxsize=1 << 16)
def skeleton(line: str) -> tuple[str, tuple[str, ...]]:
    """A line as code without whitespace, every string literal as ``""``; and the strings.
    Cached: every failing hunk of a file is weighed against the file's whole upstream diff,
    so the same lines come back once per hunk."""
    strings: list[str] = []

    def hole(m: re.Match[str]) -> str:
        strings.append(m.group("body"))
        return '""'

    return re.sub(r"\s+", "", _STRING_RE.sub(hole, line)), tuple(strings)


def _tokens(lines: list[str], strings: bool = False) -> list[str]:
    """The code tokens of ``lines`` (each string literal as ``""``), or with ``strings``
    the tokens of their string contents (words, each punctuation mark)."""
    parts = [skeleton(ln) for ln in lines]
    if strings:
        return [t for _, found in parts for s in found for t in _TOKEN_RE.findall(s)]
    return _TOKEN_RE.findall("\n".join(code for code, _ in parts))


def delta(minus: list[str], plus: list[str], strings: bool = False) -> list[str]:
    """The tokens a change brings in: those of ``plus`` not kept from ``minus`` (of the
    code, or with ``strings`` of the string contents).

    Comparing whole changed lines would count what a modified line keeps (``x = f(a)`` →
    ``x = f(b)`` keeps most of itself), and two different edits of one line would look
    alike; the tokens each change brings in are what must agree.
    """
    old, new = _tokens(minus, strings), _tokens(plus, strings)
    sm = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [t for tag, _, _, j1, j2 in sm.get_opcodes() if tag != "equal" for t in new[j1:j2]]


def _ratio(ours: tuple[list[str], list[str]], theirs: tuple[list[str], list[str]],
           strings: bool) -> float | None:
    a, b = delta(*ours, strings), delta(*theirs, strings)
    if not a and not b:  # changes that only remove: of the tokens they remove
        a, b = delta(ours[1], ours[0], strings), delta(theirs[1], theirs[0], strings)
    if not a and not b:
        return None  # neither change has tokens of this kind
    if not a or not b:
        return 0.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def similarity(ours: tuple[list[str], list[str]], theirs: tuple[list[str], list[str]]
               ) -> float:
    """difflib's ratio of the tokens two changes (minus, plus) bring in, code and string
    contents apart, the lower of the two; for changes that only remove, of the tokens they
    remove. String tokens count only where either change has some."""
    found = [r for r in (_ratio(ours, theirs, False), _ratio(ours, theirs, True))
             if r is not None]
    return min(found, default=0.0)


def changed(lines: list[str], tag: str) -> list[str]:
    """The non-blank lines of a diff body with ``tag`` (``+`` or ``-``), without it."""
    return [ln[1:] for ln in lines if ln[:1] == tag and not ln.startswith(tag * 3 + " ")
            and ln[1:].strip()]


def evidence(hunk: Hunk, upstream: list[UpstreamHunk], lo: int, hi: int
             ) -> Evidence | None:
    """The evidence that upstream made ``hunk``'s change (it spans old lines lo..hi).

    None when the hunk changes nothing; else the similarity at least, and ``how`` set when
    either test holds.
    """
    ours_plus = changed(list(hunk.lines), "+")
    ours_minus = changed(list(hunk.lines), "-")
    all_plus = [ln for _, _, body in upstream for ln in changed(body[1:], "+")]
    region = [body for start, count, body in upstream
              if lo and start <= hi + 3 and start + count >= lo - 3]
    region_lines = [ln for body in region for ln in body[1:]]
    theirs_plus = changed(region_lines, "+")
    theirs_minus = changed(region_lines, "-")
    if not ours_plus and not ours_minus:
        return None
    side = side_by_side(
        [ln for ln in hunk.lines if ln[:1] in "+-"],
        [ln for ln in region_lines if ln[:1] in "+-"],
    )
    ratio = similarity((ours_minus, ours_plus), (theirs_minus, theirs_plus))
    if ours_plus:
        have = {skeleton(ln) for ln in all_plus}  # code and strings: a line is both
        ours = [skeleton(ln) for ln in ours_plus]
        # A line like ``)`` or ``return`` is in any diff: at least one must say something.
        if (any(len(code) + sum(map(len, strings)) >= 8 for code, strings in ours)
                and all(line in have for line in ours)):
            return Evidence("contained", ratio, "its added lines are all in the upstream "
                            "diff", side)
    else:  # a hunk that only removes: upstream removed the same lines
        gone = {skeleton(ln) for _, _, body in upstream for ln in changed(body[1:], "-")}
        if all(skeleton(ln) in gone for ln in ours_minus):
            return Evidence("contained", ratio, "the lines it removes are removed upstream "
                            "too", side)
    if ratio >= THRESHOLD:
        return Evidence("similar", ratio,
                        f"upstream changed the same region alike: similarity {ratio:.2f} "
                        f"(threshold {THRESHOLD})", side)
    return Evidence("", ratio, "", side)


def side_by_side(left: list[str], right: list[str], width: int = _WIDTH) -> str:
    """Two columns, ours | upstream, each line cut to ``width``."""
    def cell(s: str) -> str:
        s = s.replace("\t", "    ")
        return (s[: width - 1] + "…") if len(s) > width else s.ljust(width)

    rows = [f"{cell('ours')} | upstream", f"{'-' * width} | {'-' * width}"]
    for k in range(max(len(left), len(right))):
        a = left[k] if k < len(left) else ""
        b = right[k] if k < len(right) else ""
        rows.append(f"{cell(a)} | {b[:width]}".rstrip())
    return "\n".join(rows)
