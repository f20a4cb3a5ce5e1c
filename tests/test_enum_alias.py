"""The enum-alias rule through the lint's run: the series patched on the pinned wheel, each
patch's enum members compared before and after it, on a tiny project (issue 26)."""

from __future__ import annotations

from pathlib import Path

from qwen38build.inputs import recipe
from qwen38build.lint import lint
from qwen38build.lint.enumalias import enum_members
from tests.engine_fixtures import FILES, make_project, make_wheel, write_patch

MODES = ("import enum\nfrom enum import IntEnum\n\n\nclass Mode(IntEnum):\n    NONE = 0\n"
         "    FAST = 1\n    SLOW = 2\n\n\nclass Other(enum.Enum):\n    A = 'a'\n")


def _project(tmp: Path, first: str, second: str) -> Path:
    wheel = make_wheel(tmp / "wheels", {**FILES, "vllm/modes.py": MODES})
    root = make_project(tmp / "proj", wheel, ["mode-a"], ["mode-b"])
    one = MODES.replace("    SLOW = 2\n", f"    SLOW = 2\n{first}")
    two = one.replace("    A = 'a'\n", f"    A = 'a'\n{second}")
    write_patch(root, "patches", "mode-a", [("modes.py", MODES, one)], tmp / "d")
    write_patch(root, "kvarn", "mode-b", [("modes.py", one, two)], tmp / "d")
    return wheel


def _aliases(tmp: Path, first: str, second: str) -> list[str]:
    wheel = _project(tmp, first, second)
    findings = lint.check(recipe.load(tmp / "proj" / "recipe.toml"), pristine_envs=wheel)
    return [f"{f.file}:{f.line}: {f.message}" for f in findings if f.rule == "enum-alias"]


def test_each_patch_is_judged_on_the_enum_as_the_earlier_ones_leave_it(tmp_path: Path) -> None:
    # the first patch adds a fresh member; the second a value the first patch's member has
    found = _aliases(tmp_path, "    TURBO = 7\n", "    B = 'b'\n    C = 'b'\n")
    assert len(found) == 1
    assert found[0].startswith("kvarn/mode-b.patch:")
    assert "Other.C = 'b' takes the value of Other.B" in found[0]
    found = _aliases(tmp_path / "2", "    TURBO = 1\n", "    B = 'b'\n")
    assert len(found) == 1 and "Mode.TURBO = 1 takes the value of Mode.FAST" in found[0]
    assert found[0].startswith("patches/mode-a.patch:")


def test_distinct_values_and_non_literals_pass(tmp_path: Path) -> None:
    assert _aliases(tmp_path, "    TURBO = 100\n", "    B = enum.auto()\n") == []


def test_members_are_read_from_enum_classes_only() -> None:
    text = MODES + "\n\nclass Plain:\n    X = 1\n    Y = 1\n"
    members = enum_members(text.encode())
    assert set(members) == {"Mode", "Other"}
    assert members["Mode"]["FAST"] == (1, 7)
    assert enum_members(b"def broken(:\n") == {}
