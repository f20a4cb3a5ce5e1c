"""The verbs around a build: plan, show, why, reproduce, verify, apply, gc, ci matrix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qwen38build.engine.reproduce import diffoscope_program
from qwen38build.store.store import Store
from tests.conftest import ENVS, SERVER, Project


def _build(p: Project, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    assert p.run("build", "--json", "-q") == 0
    out: dict[str, str] = json.loads(capsys.readouterr().out)
    return out


def test_plan_lists_steps_digests_built_state_and_declared_parts(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    assert project.run("plan", "--json") == 0
    before = json.loads(capsys.readouterr().out)
    assert [s["kind"] for s in before["steps"]] == ["fetch", "patch", "wheel"]
    assert not any(s["built"] for s in before["steps"])
    declared = {d["name"]: d["status"] for d in before["declared"]}
    assert "fa2/fp8-kv.diff does not exist" in declared["fa2"]
    assert "source 'flash-attention' is not locked" in declared["fa2"]
    assert declared["series group kvarn/"].startswith("declared, empty")
    build = _build(project, capsys)
    assert project.run("plan", "--json") == 0
    after = json.loads(capsys.readouterr().out)
    assert all(s["built"] for s in after["steps"])
    assert after["build"] == build["build"] == after["steps"][-1]["digest"]


def test_show_prints_the_whole_derivation(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    assert project.run("show", "patch") == 0
    drv = json.loads(capsys.readouterr().out)
    assert drv["kind"] == "patch" and len(drv["implementation"]) == 64
    assert [name for name, _ in drv["inputs"]] == ["route-fix", "knob"]
    assert drv["params"]["series"] == ["route-fix", "knob"]
    assert drv["deps"][0][0] == "wheel" and len(drv["deps"][0][1]) == 64
    assert project.run("show", "nonsense") == 2
    assert "is not in the plan" in capsys.readouterr().err


def test_why_names_the_patch_that_changed(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    _build(project, capsys)
    assert project.run("why", "wheel") == 0
    assert "is built; nothing changed" in capsys.readouterr().out
    project.patch("knob", "envs.py", ENVS, ENVS.replace("KNOB_9 = 9\n", "KNOB_9 = 99\n"))
    assert project.run("why", "wheel") == 0
    out = capsys.readouterr().out
    assert "dependency patched changed" in out
    assert "input changed: knob" in out
    assert "route-fix" not in out


def test_reproduce_passes_then_names_the_tampered_step(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    build = _build(project, capsys)
    assert project.run("reproduce", build["build"][:12], "-q") == 0
    assert capsys.readouterr().out.startswith(f"reproduced {build['build']}")
    store = Store(project.store)
    patch_digest = next(
        s["digest"] for s in json.loads((store.builds / f"{build['build']}.json").read_text())["steps"]
        if s["derivation"]["kind"] == "patch"
    )
    target = store.objects / patch_digest / "tree" / "envs.py"
    os.chmod(target.parent, 0o755)
    os.chmod(target, 0o644)
    target.write_text(target.read_text().replace("70", "71"))
    assert project.run("reproduce", build["build"], "-q") == 1
    out = capsys.readouterr().out
    assert "NOT reproduced" in out
    assert f"step series ({patch_digest[:12]}): tree/envs.py" in out


def test_reproduce_works_after_the_recipe_moved_on(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    build = _build(project, capsys)
    project.patch("route-fix", "server.py", SERVER, SERVER.replace("return 8\n", "return 88\n"))
    (project.root / "patches" / "knob.patch").unlink()
    assert project.run("reproduce", build["build"], "-q") == 0
    assert "reproduced" in capsys.readouterr().out


def test_reproduce_of_unknown_hash_is_usage_error(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    assert project.run("reproduce", "abcdef1234") == 2
    assert "no build 'abcdef1234' is recorded" in capsys.readouterr().err


def _install(wheel: str, target: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
         "--disable-pip-version-check", "--no-index", "--target", str(target), wheel],
        check=True, capture_output=True,
    )
    return target


def test_verify_and_apply_on_an_installed_tree(project: Project, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    build = _build(project, capsys)
    site = _install(build["wheel"], tmp_path / "site")
    assert project.run("verify", str(site)) == 0
    assert "holds exactly build 0.0.1+q38." in capsys.readouterr().out
    (site / "vllm" / "server.py").write_text("drift\n")
    (site / "vllm" / "stray.py").write_text("x\n")
    assert project.run("verify", str(site), "--json") == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert {"path": "vllm/server.py", "kind": "drifted", "owners": ["route-fix"]} in problems
    assert {"path": "vllm/stray.py", "kind": "extra", "owners": []} in problems
    # apply puts the build's bytes back and keeps the installed RECORD true
    pristine = _install(str(project.wheels / "vllm-0.0.1-cp38-abi3-manylinux_2_28_x86_64.whl"),
                        tmp_path / "pristine")
    assert project.run("verify", str(pristine)) == 1
    capsys.readouterr()
    assert project.run("apply", str(pristine)) == 0
    assert "wrote vllm/server.py" in capsys.readouterr().out
    assert project.run("verify", str(pristine)) == 0
    record = (pristine / "vllm-0.0.1.dist-info" / "RECORD").read_text()
    from tests.engine_fixtures import record_hash

    assert record_hash((pristine / "vllm" / "server.py").read_bytes()) in record


def test_verify_is_exact_when_two_patches_touch_one_file(project: Project, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    once = SERVER.replace("return 3\n", "return 33\n")
    project.patch("knob", "server.py", once, once.replace("return 17\n", "return 177\n"))
    build = _build(project, capsys)
    site = _install(build["wheel"], tmp_path / "site")
    assert project.run("verify", str(site)) == 0
    capsys.readouterr()
    # undo only the second patch's change: a reverse dry-run of the first still passes,
    # the final-hash comparison does not
    f = site / "vllm" / "server.py"
    f.write_text(f.read_text().replace("return 177\n", "return 17\n"))
    assert project.run("verify", str(site)) == 1
    assert "drifted: vllm/server.py (owned by route-fix, knob)" in capsys.readouterr().out


def test_apply_refuses_a_different_pin(project: Project, capsys, tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    _build(project, capsys)
    other = make(tmp_path / "other", version="0.0.2")
    site = _install(str(other), tmp_path / "site")
    assert project.run("apply", str(site)) == 2
    assert "vLLM 0.0.2 is installed, but this build is of 0.0.1; refused" in capsys.readouterr().err


def test_gc_keeps_rooted_builds_and_removes_the_rest(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    first = _build(project, capsys)
    project.patch("knob", "envs.py", ENVS, ENVS.replace("KNOB_9 = 9\n", "KNOB_9 = 99\n"))
    second = _build(project, capsys)
    assert project.run("gc") == 0
    removed = capsys.readouterr().out
    assert first["build"] in removed and second["build"] not in removed
    store = Store(project.store)
    assert store.get(second["build"]) is not None and store.lookup(first["build"]) is None
    assert project.run("store", "verify") == 0


def test_ci_matrix_has_one_entry_per_canonical_arch(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    assert project.run("ci", "matrix") == 0
    assert json.loads(capsys.readouterr().out) == {
        "include": [{"arch": "8.6", "sm": "86"}, {"arch": "9.0", "sm": "90"}]
    }


def test_every_command_is_listed_for_the_one_subparser_fast_path(capsys) -> None:  # type: ignore[no-untyped-def]
    from qwen38build.cli import main
    from qwen38build.cli.commands import NAMES as COMMANDS
    from qwen38build.cli.commands import parser

    full = parser()
    choices = next(a.choices for a in full._actions if a.dest == "command")
    assert choices is not None and set(choices) == set(COMMANDS)
    with pytest.raises(SystemExit) as info:
        main(["verify", "--help"])
    assert info.value.code == 0
    assert "--full" in capsys.readouterr().out


@pytest.mark.skipif(diffoscope_program() is None, reason="diffoscope is not installed")
def test_reproduce_shows_a_diffoscope_report_of_the_tampered_file(project: Project, capsys) -> None:  # type: ignore[no-untyped-def]
    build = _build(project, capsys)
    store = Store(project.store)
    record = json.loads((store.builds / f"{build['build']}.json").read_text())
    patch_digest = next(s["digest"] for s in record["steps"] if s["derivation"]["kind"] == "patch")
    target = store.objects / patch_digest / "tree" / "server.py"
    os.chmod(target.parent, 0o755)
    os.chmod(target, 0o644)
    target.write_text(target.read_text().replace("return 33", "return 34"))
    assert project.run("reproduce", build["build"], "-q") == 1
    out = capsys.readouterr().out
    assert "tree/server.py" in out
    assert "-    return 34" in out and "+    return 33" in out  # diffoscope's own text report


def test_version_prints_the_version_and_the_digest_of_the_package_source(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import re
    import shutil

    import qwen38build
    from qwen38build.cli import main
    from qwen38build.cli.version import package_digest

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    line = capsys.readouterr().out.strip()
    shown = re.fullmatch(r"qwen38build (\S+) \(implementation ([0-9a-f]{64})\)", line)
    assert shown is not None, line
    assert shown[1] == qwen38build.__version__
    # The digest is of the source, not of where it lies: a copy elsewhere gives the same one,
    # and an edit to any module gives another.
    copy = tmp_path / "qwen38build"
    shutil.copytree(Path(qwen38build.__file__).parent, copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert package_digest(str(copy)) == shown[2]
    (copy / "store" / "gc.py").write_text((copy / "store" / "gc.py").read_text() + "# edit\n")
    assert package_digest(str(copy)) != shown[2]
