"""The enum-alias lint rule on vLLM 0.32.0's real ``KVQuantMode`` (issue 26).

A patch written for this test adds a member to ``KVQuantMode`` in the pristine
``v1/kv_cache_interface.py``: with the value 11, which 0.32.0's ``ULTRAQUANT_4BIT`` holds
(the silent alias the KVarN group's note describes), the rule flags it at the added line;
with 100 it does not. The project's own series, linted against the pinned wheel, has no
such finding.
"""

from __future__ import annotations

from pathlib import Path

from qwen38build.inputs import recipe
from qwen38build.lint import lint
from qwen38build.lint.enumalias import enum_aliases, enum_members
from qwen38build.lint.finding import Context
from qwen38build.series.patchfile import PatchFile
from tests.engine_fixtures import git_diff, patch_text
from tests.patches.conftest import REPO, built_wheels

REL = "v1/kv_cache_interface.py"


def _patch(tmp: Path, pristine: str, line: str) -> tuple[PatchFile, str]:
    anchor = "    ULTRAQUANT_4BIT = 11"
    assert anchor in pristine
    at = pristine.index("\n", pristine.index(anchor)) + 1
    patched = pristine[:at] + line + pristine[at:]
    path = tmp / "kvq-mode.patch"
    path.write_text(patch_text("kvq-mode", git_diff(REL, pristine, patched, tmp / "d"),
                               pin="0.32.0"))
    return PatchFile.parse(path), patched


def test_a_member_taking_an_existing_value_is_an_alias(pristine_vllm: Path, tmp_path: Path
                                                        ) -> None:
    pristine = (pristine_vllm / REL).read_text()
    assert enum_members(pristine.encode())["KVQuantMode"]["ULTRAQUANT_4BIT"][0] == 11
    ctx = Context(recipe.load(REPO / "recipe.toml"))
    pf, patched = _patch(tmp_path, pristine, "    KVARN = 11  # the test's duplicate\n")
    found = list(enum_aliases(ctx, pf, {REL: pristine.encode()}, {REL: patched.encode()}))
    assert len(found) == 1
    (f,) = found
    assert f.rule == "enum-alias"
    assert "KVQuantMode.KVARN = 11 takes the value of KVQuantMode.ULTRAQUANT_4BIT" in f.message
    assert pf.path.read_text().split("\n")[f.line - 1] == "+    KVARN = 11  # the test's duplicate"
    pf, patched = _patch(tmp_path, pristine, "    KVARN = 100\n")
    assert list(enum_aliases(ctx, pf, {REL: pristine.encode()}, {REL: patched.encode()})) == []


def test_the_series_adds_no_alias() -> None:
    _, pristine_wheel, _ = built_wheels()
    findings = lint.check(recipe.load(REPO / "recipe.toml"), pristine_envs=pristine_wheel)
    assert [f for f in findings if f.rule == "enum-alias"] == []
    assert findings == []
