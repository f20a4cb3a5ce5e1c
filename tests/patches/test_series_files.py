"""The tranche's patch files: header block, export marker, clean diff text."""

from __future__ import annotations

import re

import pytest

from .conftest import PATCHES_DIR, PIN, SERIES

pytestmark = pytest.mark.e2e

HEADERS = ["Kind", "What", "Upstream", "Cut-against", "Retires-when"]
MARKER = re.compile(
    r"^--- exported from [0-9a-f]{40} \((?P<topic>[^)]+)\); "
    r"regenerate with qwen38build export, do not edit ---$"
)


@pytest.mark.parametrize("topic", SERIES)
def test_patch_file_shape(topic: str) -> None:
    raw = (PATCHES_DIR / f"{topic}.patch").read_bytes()
    assert b"\r" not in raw and b"\0" not in raw
    text = raw.decode()
    lines = text.splitlines()
    marker_idx = next(i for i, line in enumerate(lines) if line.startswith("--- exported from "))
    match = MARKER.match(lines[marker_idx])
    assert match and match["topic"] == topic
    preamble = lines[:marker_idx]
    names = [line.split(":", 1)[0] for line in preamble
             if re.match(r"^[A-Z][A-Za-z-]+: ", line)]
    assert names[-5:] == HEADERS, names
    # Prose comes first, then the headers; continuation lines start with spaces.
    first_header = next(i for i, line in enumerate(preamble) if line.startswith("Kind: "))
    assert any(line.strip() for line in preamble[:first_header]), "no prose"
    for line in preamble[first_header:]:
        assert re.match(r"^([A-Z][A-Za-z-]+: |  \S)", line), line
    cut = next(line for line in preamble if line.startswith("Cut-against: "))
    # the pin the hunks are cut on: the recipe's (after a bump, export writes the new one)
    assert cut == f"Cut-against: {PIN}" or cut.startswith(f"Cut-against: {PIN}: ")
    diff = lines[marker_idx + 1:]
    assert diff and diff[0].startswith("diff --git a/")
    assert not any(line.startswith(("+++ b/vllm/", "--- a/vllm/")) for line in diff)
    assert not any("Binary files" in line for line in diff)
    for line in diff:
        if line.startswith("+") and not line.startswith("+++"):
            assert line == line.rstrip(), f"trailing whitespace: {line!r}"
