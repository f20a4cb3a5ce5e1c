"""lineage: the series applied in memory gives GNU patch's bytes, and every line its origin."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qwen38build.series.gnupatch import run_patch
from qwen38build.series.lineage import Lineage, Origin
from qwen38build.series.patchfile import PatchFile
from tests.bump_fixtures import numbered
from tests.engine_fixtures import write_patch

A = numbered("a", 40)


def sub(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def series(tmp_path: Path, steps: list[tuple[str, list[tuple[str, str | None, str | None]]]]
           ) -> list[PatchFile]:
    (tmp_path / "proj" / "patches").mkdir(parents=True)
    return [PatchFile.parse(write_patch(tmp_path / "proj", "patches", topic, diffs,
                                        tmp_path / "diffs"))
            for topic, diffs in steps]


def gnu(tmp_path: Path, files: dict[str, bytes | None], pfs: list[PatchFile]
        ) -> dict[str, bytes | None]:
    tree = tmp_path / "gnu"
    for rel, data in files.items():
        if data is not None:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes(data)
    for pf in pfs:
        assert run_patch(pf.path, tree).ok
    out = {rel: (tree / rel).read_bytes() if (tree / rel).exists() else None for rel in files}
    shutil.rmtree(tree)
    return out


def test_in_memory_series_matches_gnu_patch_with_offsets_and_new_files(tmp_path: Path) -> None:
    one = sub(sub(A, "a line 5\n", "a line 5 one\n"), "a line 30\n", "a line 30\nadded 1\n")
    # cut against a tree with five more lines on top: GNU patch applies it with an offset
    shifted = "".join(f"top {i}\n" for i in range(5)) + one
    two_cut = sub(shifted, "a line 20\n", "a line 20 two\n")
    pfs = series(tmp_path, [
        ("one", [("a.py", A, one)]),
        ("two", [("a.py", shifted, two_cut), ("new/b.py", None, "b 1\nb 2\n")]),
    ])
    files: dict[str, bytes | None] = {"a.py": A.encode(), "new/b.py": None}
    lin = Lineage(tmp_path / "scratch", files, pfs)
    lin.advance_to(2)
    assert lin.failed == []
    assert lin.data == gnu(tmp_path, files, pfs)
    assert not (tmp_path / "scratch").exists()  # nothing needed GNU patch here
    text, origin = lin.text["a.py"], lin.origin["a.py"]
    patch_lines = pfs[0].path.read_text().split("\n")
    assert origin[text.index("a line 5 one")] == Origin(0, patch_lines.index("+a line 5 one") + 1)
    assert origin[text.index("a line 20 two")].patch == 1
    assert origin[text.index("a line 7")] == Origin(None, 7)
    assert all(o.patch == 1 for o in lin.origin["new/b.py"])
    assert lin.before[1]["a.py"] == "".join(one).encode()


def test_a_patch_that_does_not_apply_is_skipped_by_gnu_patchs_verdict(tmp_path: Path) -> None:
    other = sub(A, "a line 10\n", "a line 10 elsewhere\n")
    pfs = series(tmp_path, [
        ("bad", [("a.py", other, sub(other, "a line 10 elsewhere\n", "x\n"))]),
        ("good", [("a.py", A, sub(A, "a line 30\n", "a line 30 good\n"))]),
    ])
    lin = Lineage(tmp_path / "scratch", {"a.py": A.encode()}, pfs)
    lin.advance_to(2)
    assert lin.failed == [0]
    assert lin.data["a.py"] == sub(A, "a line 30\n", "a line 30 good\n").encode()


@pytest.mark.parametrize("eof", ["no newline at the end", "deleted"])
def test_what_memory_does_not_do_goes_to_gnu_patch(tmp_path: Path, eof: str) -> None:
    old = A.rstrip("\n")
    new = sub(old, "a line 40", "a line 40 last") if eof != "deleted" else None
    pfs = series(tmp_path, [("edge", [("a.py", old if eof != "deleted" else A, new)])])
    start = old.encode() if eof != "deleted" else A.encode()
    lin = Lineage(tmp_path / "scratch", {"a.py": start}, pfs)
    lin.advance_to(1)
    assert lin.failed == []
    assert lin.data == gnu(tmp_path, {"a.py": start}, pfs)
