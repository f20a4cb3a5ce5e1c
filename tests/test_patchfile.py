"""The patch-file model: headers survive a write and a read, diffs keep their problems."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwen38build.errors import PatchFileError
from qwen38build.series.headers import format_headers, header_text
from qwen38build.series.patchfile import MARKER_PREFIX, PatchFile, marker_for

REPO = Path(__file__).resolve().parents[1]
FAKE = Path("/nowhere/patches/some-topic.patch")
DIFF = (
    "diff --git a/x.py b/x.py\n"
    "--- a/x.py\n"
    "+++ b/x.py\n"
    "@@ -1,2 +1,3 @@\n"
    " a\n"
    "+b\n"
    " c\n"
)

keys = st.from_regex(r"[A-Z][A-Za-z0-9-]{0,12}", fullmatch=True)
# A line of a value: anything but a line break (|, backticks, unicode, tabs included).
line_text = st.text(st.characters(exclude_characters="\n\r\0", exclude_categories=["Cs"]))
first_line = line_text.map(lambda s: s.rstrip(" "))
cont_line = line_text.map(lambda s: s.strip(" ")).filter(lambda s: bool(s.strip(" \t")))
canonical_value = st.builds(
    lambda first, rest: "\n".join([first, *rest]), first_line, st.lists(cont_line, max_size=4)
)
headers_of = st.dictionaries(keys, canonical_value, max_size=7)
any_headers = st.dictionaries(keys, st.text(st.characters(exclude_characters="\0")), max_size=7)
prose = st.sampled_from(["", "One line of prose.", "Two paragraphs.\n\nThe second: here."])


def _file(prose_text: str, headers: dict[str, str]) -> str:
    head = f"{prose_text}\n\n" if prose_text else ""
    block = f"{format_headers(headers)}\n" if headers else ""
    return f"{head}{block}{marker_for('0123abc', 'some-topic')}\n{DIFF}"


@given(prose, headers_of)
def test_any_canonical_header_value_survives_format_then_parse(
    prose_text: str, headers: dict[str, str]
) -> None:
    pf = PatchFile.parse(FAKE, _file(prose_text, headers))
    assert pf.headers == headers
    assert list(pf.headers) == list(headers)  # file order kept
    assert pf.prose == prose_text
    assert pf.marker_commit == "0123abc"


@given(prose, any_headers)
def test_format_parse_format_is_the_identity_for_any_value(
    prose_text: str, headers: dict[str, str]
) -> None:
    text = _file(prose_text, headers)
    pf = PatchFile.parse(FAKE, text)
    assert pf.format() == text
    assert format_headers(pf.headers) == format_headers(headers)


@given(headers_of)
def test_header_text_is_one_line_joined_by_one_space(headers: dict[str, str]) -> None:
    for value in headers.values():
        joined = header_text(value)
        assert "\n" not in joined
        assert joined == " ".join(p for p in (ln.strip(" ") for ln in value.split("\n")) if p)


def test_values_with_pipes_backticks_and_unicode_survive() -> None:
    headers = {
        "Kind": "fix",
        "What": "a | b with `code` and ünïcödé — ∑\n`more` | here",
        "Supersedes": "old-topic",
    }
    pf = PatchFile.parse(FAKE, _file("Prose.", headers))
    assert pf.headers == headers
    assert pf.header_lines == {"Kind": 3, "What": 4, "Supersedes": 6}
    assert header_text(pf.headers["What"]) == "a | b with `code` and ünïcödé — ∑ `more` | here"


@pytest.mark.parametrize(
    "path",
    sorted([*REPO.glob("patches/*.patch"), *REPO.glob("kvarn/*.patch")]),
    ids=lambda p: p.name,
)
def test_real_patch_files_are_written_back_byte_for_byte(path: Path) -> None:
    text = path.read_bytes().decode("utf-8")
    pf = PatchFile.parse(path)
    assert pf.problems == ()
    assert pf.format() == text
    assert pf.marker is not None and pf.marker.startswith(MARKER_PREFIX)
    assert pf.marker_topic == pf.topic


def test_strict_parse_raises_every_structural_problem_at_once() -> None:
    bad = (
        "Kind: fix\n"
        f"{marker_for('0123abc', 'some-topic')}\n"
        "diff --git a/../etc/passwd b/../etc/passwd\n"
        "--- a/../etc/passwd\n"
        "+++ b/../etc/passwd\n"
        "@@ -1,2 +1,2 @@\n"
        " a\n"
        "+b\n"
    )
    with pytest.raises(PatchFileError) as info:
        PatchFile.parse(FAKE, bad)
    message = str(info.value)
    assert f"{FAKE}:4: diff path 'a/../etc/passwd' leaves the vllm/ package." in message
    assert f"{FAKE}:6: hunk header says -2 +2 lines but the hunk has -1 +2." in message
    lenient = PatchFile.parse(FAKE, bad, strict=False)
    assert [(p.line, p.rule) for p in lenient.problems] == [
        (4, "diff-hygiene"), (5, "diff-hygiene"), (6, "diff-hygiene"),
    ]


def test_hunk_that_counts_fewer_lines_than_it_has_is_a_problem() -> None:
    text = _file("", {"Kind": "fix"}).replace("@@ -1,2 +1,3 @@", "@@ -1,1 +1,1 @@")
    pf = PatchFile.parse(FAKE, text, strict=False)
    assert [(p.line, p.rule) for p in pf.problems] == [(6, "diff-hygiene")]
    assert "goes on past them (line 8 is not counted)" in pf.problems[0].message


def test_crlf_is_kept_in_the_diff_and_dropped_from_the_headers() -> None:
    text = _file("Prose.", {"Kind": "fix"}).replace("\n", "\r\n")
    pf = PatchFile.parse(FAKE, text)
    assert pf.headers == {"Kind": "fix"}
    assert pf.files[0].hunks[0].lines[1] == "+b\r"


def test_duplicate_header_is_reported_with_both_lines() -> None:
    text = _file("", {"Kind": "fix"}).replace("Kind: fix", "Kind: fix\nKind: own")
    pf = PatchFile.parse(FAKE, text, strict=False)
    assert pf.headers["Kind"] == "fix"
    assert [(p.line, p.rule, p.message) for p in pf.problems] == [
        (2, "headers", "header 'Kind' appears twice (first at line 1).")
    ]


def test_touched_paths_and_hunk_lines() -> None:
    pf = PatchFile.parse(FAKE, _file("", {"Kind": "fix"}))
    assert pf.touched_paths == ["x.py"]
    hunk = pf.files[0].hunks[0]
    assert hunk.old_lines == ["a", "c"]
    assert hunk.new_lines == ["a", "b", "c"]
    assert hunk.added() == [(8, "b")]
