"""The ledger table: written from the patch headers, only between its markers."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from qwen38build.errors import InputError
from qwen38build.inputs.recipe import LoadedRecipe, load
from qwen38build.series import table
from qwen38build.series.headers import format_headers
from qwen38build.series.patchfile import marker_for

REPO = Path(__file__).resolve().parents[1]
SEED = Path(__file__).resolve().parents[2] / "shared" / "seed" / "PATCHES.md"
DIFF = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def write_recipe(root: Path, groups: dict[str, list[str]]) -> Path:
    """A valid recipe.toml in ``root`` with ``groups`` (folder -> patch file names)."""
    parts = ['[vllm]\nversion = "0.32.0"\n\n[series]\nretired = []\n']
    for folder, names in groups.items():
        (root / folder).mkdir(exist_ok=True)
        listed = ", ".join(f'"{n}"' for n in names)
        parts.append(f'\n[[series.groups]]\ndir = "{folder}"\npatches = [{listed}]\n')
    parts.append(
        '\n[fa2]\nsource = "fa"\ncutlass = "cu"\ndiff = "fa2/fp8-kv.diff"\n\n'
        '[sources.fa]\nrepository = "https://github.com/vllm-project/flash-attention"\n'
        'commit = "0123456789abcdef0123456789abcdef01234567"\n\n'
        '[sources.cu]\nrepository = "https://github.com/NVIDIA/cutlass"\n'
        'commit = "89abcdef0123456789abcdef0123456789abcdef"\n\n[pthfa]\ntag = "v0.1.0"\n\n'
        '[cuda]\narchs = ["8.6"]\n\n[toolchain]\npython = "3.12"\ntorch = "2.11.0"\n'
        'cuda = "13.0"\n'
    )
    path = root / "recipe.toml"
    path.write_text("".join(parts), encoding="utf-8")
    return path


def write_patch(path: Path, headers: dict[str, str]) -> None:
    topic = path.name.removesuffix(".patch")
    text = f"Prose about {topic}.\n\n{format_headers(headers)}\n{marker_for('abc1234', topic)}\n"
    path.write_text(text + DIFF, encoding="utf-8")


def seed_rows() -> tuple[list[str], list[list[str]]]:
    """The seed's table lines, and each row's cells with the escaping undone."""
    if not SEED.is_file():
        pytest.skip(f"the seed ledger is not at {SEED} (CI puts shared/ beside the clone)")
    text = SEED.read_text(encoding="utf-8")
    body = text.split("<!-- table:begin", 1)[1].split("\n", 1)[1].split(table.END_LINE, 1)[0]
    lines = body.splitlines()
    rows = []
    for line in lines[2:]:
        cells = _CELL_SPLIT.split(line)[1:-1]
        rows.append([c[1:-1].replace("\\|", "|") for c in cells])
    return lines, rows


def _wrapped(value: str) -> str:
    """A long value split onto continuation lines, as an author would write it."""
    return "\n".join(textwrap.wrap(value, 72, break_long_words=False, break_on_hyphens=False))


def test_seed_table_comes_back_byte_for_byte_from_patch_headers(tmp_path: Path) -> None:
    lines, rows = seed_rows()
    groups: dict[str, list[str]] = {"patches": [], "kvarn": []}
    wrapped = 0
    for name, *values in rows:
        group, _, topic = name.rpartition("/")
        group = group or "patches"
        groups[group].append(f"{topic}.patch")
        headers = dict(zip(table.COLUMN_HEADERS, (_wrapped(v) for v in values), strict=True))
        wrapped += any("\n" in v for v in headers.values())
        (tmp_path / group).mkdir(exist_ok=True)
        write_patch(tmp_path / group / f"{topic}.patch", headers)
    assert wrapped > 10, "the round trip should exercise continuation lines"
    loaded = load(write_recipe(tmp_path, groups))
    assert table.render(loaded).splitlines() == lines


def _loaded(tmp_path: Path, rows: dict[str, dict[str, str]]) -> LoadedRecipe:
    (tmp_path / "patches").mkdir(exist_ok=True)
    for topic, headers in rows.items():
        write_patch(tmp_path / "patches" / f"{topic}.patch", headers)
    return load(write_recipe(tmp_path, {"patches": [f"{t}.patch" for t in rows]}))


ROW = {"Kind": "fix", "What": "a | b", "Upstream": "none", "Cut-against": "0.32.0",
       "Retires-when": "upstream PR"}


def test_pipe_is_escaped_and_continuations_join_with_one_space(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, {"t": {**ROW, "What": "first `x|y`\nsecond  line\nthird"}})
    assert table.render(loaded).splitlines()[2] == (
        "| t | fix | first `x\\|y` second  line third | none | 0.32.0 | upstream PR |"
    )


def test_write_leaves_everything_outside_the_markers_byte_for_byte(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, {"t": ROW})
    before = "# Ledger\r\n\nIntro  \n<!-- table:begin. generated -->\nold\n<!-- table:end -->\ntail"
    md = tmp_path / "PATCHES.md"
    md.write_bytes(before.encode())
    assert table.check(loaded, md) is not None
    assert table.write(loaded, md) is True
    after = md.read_bytes().decode()
    head, _, rest = after.partition("<!-- table:begin. generated -->\n")
    assert head == "# Ledger\r\n\nIntro  \n"
    assert rest.endswith("| t | fix | a \\| b | none | 0.32.0 | upstream PR |\n"
                         "<!-- table:end -->\ntail")
    assert table.write(loaded, md) is False
    assert table.check(loaded, md) is None


def test_stale_table_check_gives_a_unified_diff(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, {"t": ROW})
    md = tmp_path / "PATCHES.md"
    md.write_text("x\n<!-- table:begin -->\n<!-- table:end -->\n", encoding="utf-8")
    table.write(loaded, md)
    write_patch(tmp_path / "patches" / "t.patch", {**ROW, "Kind": "local"})
    diff = table.check(loaded, md)
    assert diff is not None
    assert diff.startswith("--- PATCHES.md (in the tree)\n+++ PATCHES.md (from the patch headers)")
    assert "-| t | fix |" in diff
    assert "+| t | local |" in diff


def test_missing_markers_are_an_input_error(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, {"t": ROW})
    md = tmp_path / "PATCHES.md"
    md.write_text("no table here\n", encoding="utf-8")
    with pytest.raises(InputError, match=re.escape("no '<!-- table:begin ... -->' line")):
        table.check(loaded, md)
    md.write_text("<!-- table:begin -->\nrows\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"PATCHES.md:1: the table begins here"):
        table.write(loaded, md)


def test_seed_ledger_is_left_as_it_is_when_its_table_is_current(tmp_path: Path) -> None:
    _, rows = seed_rows()
    groups: dict[str, list[str]] = {"patches": [], "kvarn": []}
    for name, *values in rows:
        group, _, topic = name.rpartition("/")
        groups[group or "patches"].append(f"{topic}.patch")
        (tmp_path / (group or "patches")).mkdir(exist_ok=True)
        write_patch(tmp_path / (group or "patches") / f"{topic}.patch",
                    dict(zip(table.COLUMN_HEADERS, values, strict=True)))
    loaded = load(write_recipe(tmp_path, groups))
    md = tmp_path / "PATCHES.md"
    md.write_bytes(SEED.read_bytes())
    assert table.check(loaded, md) is None
    assert table.write(loaded, md) is False
    assert md.read_bytes() == SEED.read_bytes()


def test_project_ledger_table_is_current() -> None:
    loaded = load(REPO / "recipe.toml")
    diff = table.check(loaded, REPO / "PATCHES.md")
    assert diff is None, f"PATCHES.md is stale; run qwen38build table:\n{diff}"
