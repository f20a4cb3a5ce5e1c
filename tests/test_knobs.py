"""The env-knob rule reads code: every form of environment read, caught, named and attributed.

Each test cuts a real series with git against a tiny real wheel (vllm/envs.py and a module),
then runs the lint's rule with the wheel (the touched files patched and parsed whole) and
without it (the added lines read on their own).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen38build.lint import lint
from qwen38build.lint.finding import Finding
from qwen38build.series import knobs, lineage
from qwen38build.series.patchfile import PatchFile
from tests.bump_fixtures import PIN, Project, make_project, make_wheel

ENVS = """\
import os
from typing import Any, Callable

environment_variables: dict[str, Callable[[], Any]] = {
    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
}
"""
MOD = """\
import os

from vllm import envs

PRISTINE = os.environ.get("PRISTINE_ONLY", "")
WRAPPED = os.environ.get(
    "PRISTINE_WRAPPED", "0"
)


def serve() -> int:
    return 1
"""
REGISTRY = ENVS.replace(
    '    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),\n',
    '    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),\n'
    '    "KNOB_X": lambda: os.getenv("KNOB_X", ""),\n',
)

# Each form: the code a patch adds at the top of serve()'s module, and how the finding
# names the read.
FORMS = {
    "wrapped-get": ('_PROBE = os.environ.get(\n    "KNOB_X", "0"\n)\n', "(os.environ.get)"),
    "alias-os": ('import os as _os\nV = _os.environ.get("KNOB_X")\n',
                 "(_os.environ.get, import os as _os)"),
    "from-environ": ('from os import environ, getenv\nV = environ["KNOB_X"]\n',
                     "(environ[...], from os import environ)"),
    "from-getenv": ('from os import environ, getenv\nV = getenv("KNOB_X")\n',
                    "(getenv, from os import getenv)"),
    "setdefault": ('V = os.environ.setdefault("KNOB_X", "1")\n', "(os.environ.setdefault)"),
    "copy": ('_ENV = os.environ.copy()\nV = _ENV["KNOB_X"]\n',
             "(_ENV[...], _ENV = os.environ.copy())"),
    "in": ('ON = "KNOB_X" in os.environ\n', "(in os.environ)"),
    "subscript": ('V = os.environ["KNOB_X"]\n', "(os.environ[...])"),
    "getenv": ('V = os.getenv("KNOB_X")\n', "(os.getenv)"),
    "envs-attr": ("V = envs.KNOB_X\n", "(envs.NAME)"),
    "envs-is-set": ('V = envs.is_set("KNOB_X")\n', "(envs.is_set)"),
    "from-vllm-envs": ("from vllm.envs import KNOB_X\n", "(from vllm.envs import)"),
}


def project(tmp_path: Path, added: str, *, register: bool = False) -> tuple[Project, Path]:
    wheel = make_wheel(tmp_path / "wheels", PIN, {"__init__.py": "", "envs.py": ENVS,
                                                  "mod.py": MOD})
    topics = ["speed-knobs-envs", "feature"]
    p = make_project(tmp_path, wheel, topics)
    p.patch("patches", "speed-knobs-envs", [("envs.py", ENVS, REGISTRY if register else
                                             ENVS.replace("import os\n", "import os  # knobs\n"))])
    new = MOD.replace("from vllm import envs\n", "from vllm import envs\n" + added)
    p.patch("patches", "feature", [("mod.py", MOD, new)])
    return p, wheel


def env_findings(p: Project, wheel: Path | None) -> list[Finding]:
    loaded = lint.load_for_lint(p.root / "recipe.toml")
    return [f for f in lint.check(loaded, pristine_envs=wheel) if f.rule == "env-knobs"]


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text().split("\n")
    return next(i for i, ln in enumerate(lines, start=1) if needle in ln)


@pytest.mark.parametrize("with_wheel", [True, False], ids=["tree", "hunks"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_of_read_is_caught_and_named(
    tmp_path: Path, form: str, with_wheel: bool
) -> None:
    added, named = FORMS[form]
    p, wheel = project(tmp_path, added)
    findings = env_findings(p, wheel if with_wheel else None)
    findings = [f for f in findings if "KNOB_X" in f.message]
    assert len(findings) == 1, "\n".join(map(str, findings))
    (f,) = findings
    patch = p.root / "patches" / "feature.patch"
    assert f.file == Path("patches/feature.patch")
    assert f.line == line_of(patch, "KNOB_X")
    assert f"feature reads env knob KNOB_X {named} in mod.py" in f.message


@pytest.mark.parametrize("with_wheel", [True, False], ids=["tree", "hunks"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_of_a_registered_knob_passes(
    tmp_path: Path, form: str, with_wheel: bool
) -> None:
    p, wheel = project(tmp_path, FORMS[form][0], register=True)
    findings = env_findings(p, wheel if with_wheel else None)
    assert [f for f in findings if "KNOB_X" in f.message] == []


def test_any_name_counts_and_the_allowlist_is_explicit(tmp_path: Path) -> None:
    p, wheel = project(tmp_path, 'T = os.getenv("HF_HOME")\nU = os.getenv("HF_TOKEN")\n')
    (f, g) = env_findings(p, wheel)
    assert "HF_HOME (os.getenv)" in f.message and "HF_TOKEN (os.getenv)" in g.message
    assert "[lint] env_allow" in f.hint
    recipe = p.root / "recipe.toml"
    recipe.write_text(recipe.read_text() + '\n[lint]\nenv_allow = ["HF_HOME"]\n')
    (g,) = env_findings(p, wheel)
    assert "HF_TOKEN" in g.message


def test_pristine_reads_are_vllms_own_and_writes_are_not_reads(tmp_path: Path) -> None:
    added = 'os.environ["KNOB_W"] = "1"\ndel os.environ["KNOB_D"]\n# os.getenv("KNOB_C")\n'
    p, wheel = project(tmp_path, added)
    assert env_findings(p, wheel) == []
    assert env_findings(p, None) == []


def test_a_read_belongs_to_the_patch_that_added_it(tmp_path: Path) -> None:
    """A later patch that edits around an earlier one's read does not inherit it."""
    p, wheel = project(tmp_path, 'V = os.getenv("KNOB_X")\n')
    entries = p.loaded().series_entries()
    patched = MOD.replace("from vllm import envs\n",
                          'from vllm import envs\nV = os.getenv("KNOB_X")\n')
    later = patched.replace("    return 1\n", "    return 2\n")
    p.patch("patches", "later", [("mod.py", patched, later)])
    recipe = p.root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('    "feature.patch",\n',
                                                 '    "feature.patch",\n    "later.patch",\n'))
    pfs = [PatchFile.parse(e.path) for e in p.loaded().series_entries()]
    assert len(pfs) == len(entries) + 1
    tree = lineage.from_wheel(tmp_path / "tree", wheel, pfs)
    assert tree.failed == []
    reads = [r for r in knobs.series_reads(pfs, tree) if r.name == "KNOB_X"]
    assert [(pfs[r.patch].topic, r.file) for r in reads] == [("feature", "mod.py")]


def test_a_file_that_does_not_parse_falls_back_to_its_added_lines(tmp_path: Path) -> None:
    p, wheel = project(tmp_path, 'V = os.getenv(\n    "KNOB_X")\ndef broken(:\n')
    (f,) = env_findings(p, wheel)
    assert "KNOB_X (os.getenv)" in f.message


def test_reads_in_source_names_every_form() -> None:
    src = "".join(a for a, _ in FORMS.values())
    names = {(r.name, r.form.split(",")[0]) for r in knobs.reads_in_source(src) or []}
    assert {n for n, _ in names} == {"KNOB_X"}
    assert len(names) == len(FORMS)


def test_index_lines_are_checked_against_the_series_tree(tmp_path: Path) -> None:
    p, wheel = project(tmp_path, 'V = os.getenv("VLLM_HOST_IP")\n')
    loaded = lint.load_for_lint(p.root / "recipe.toml")
    assert lint.check(loaded, pristine_envs=wheel) == []  # git's own index lines hold
    patch = p.root / "patches" / "feature.patch"
    text = patch.read_text()
    index = next(ln for ln in text.split("\n") if ln.startswith("index "))
    old = index.split()[1].split("..")[0]
    patch.write_text(text.replace(index, index.replace(old, "1234567", 1)))
    (f,) = lint.check(loaded, pristine_envs=wheel)
    assert (f.file, f.line, f.rule) == (Path("patches/feature.patch"),
                                        line_of(patch, "index 1234567"), "diff-hygiene")
    assert f.message.startswith(
        f"mod.py: the 'index' line names pre-image 1234567, but the file as pristine vLLM "
        f"and the earlier patches leave it is blob {old}"
    )
    # Without the wheel the file before the patch is not known: nothing to check.
    assert [x for x in lint.check(loaded, pristine_envs=None) if x.rule == "diff-hygiene"] == []


@pytest.mark.parametrize("with_wheel", [True, False], ids=["tree", "hunks"])
def test_a_name_changed_inside_a_pristine_wrapped_call_is_a_read(
    tmp_path: Path, with_wheel: bool
) -> None:
    """Only the line with the name is added; the call's head is pristine context."""
    wheel = make_wheel(tmp_path / "wheels", PIN, {"__init__.py": "", "envs.py": ENVS,
                                                  "mod.py": MOD})
    p = make_project(tmp_path, wheel, ["rename"])
    p.patch("patches", "rename", [("mod.py", MOD, MOD.replace('"PRISTINE_WRAPPED"', '"KNOB_Y"'))])
    (f,) = env_findings(p, wheel if with_wheel else None)
    assert f.line == line_of(p.root / "patches" / "rename.patch", '+    "KNOB_Y"')
    assert "rename reads env knob KNOB_Y (os.environ.get) in mod.py" in f.message
