"""One build for the whole stack: every output in one directory, each part under its own
digest, the links checked like any output.

The project is the engine's, with pthfa sources and the stand-in toolchain its lock pins,
building two outputs (the patched wheel and the pthfa wheel); the environment lock's own
tests live in test_envlock.py.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qwen38build.cli import main
from qwen38build.store.store import Store
from tests.conftest import Project
from tests.engine_fixtures import add_pthfa_sources


@pytest.fixture
def stack(project: Project) -> Project:
    add_pthfa_sources(project.root)
    recipe = project.root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('outputs = ["vllm"]',
                                                 'outputs = ["vllm", "pthfa"]'))
    return project


def _build(p: Project, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert p.run("build", "--json", "-q", *argv) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_result_holds_every_output_each_in_its_own_entry(
    stack: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _build(stack, capsys)
    outputs = out["outputs"]
    assert isinstance(outputs, dict) and set(outputs) == {"wheel", "pthfa"}
    result = stack.root / "result"
    assert os.readlink(result).endswith(str(out["build"]))
    names = sorted(os.listdir(result))
    assert names == sorted([Path(outputs["wheel"]).name, "manifest.json",
                            Path(outputs["pthfa"]).name])
    for label in ("wheel", "pthfa"):
        part = Path(outputs[label])
        assert part.parent.name != out["build"]  # the part keeps its own entry and digest
        assert (result / part.name).read_bytes() == part.read_bytes()
    with zipfile.ZipFile(result / Path(outputs["pthfa"]).name) as z:
        assert any(n.endswith(".cubin") for n in z.namelist())
    assert main(["--store", str(stack.store), "store", "verify"]) == 0


def test_only_narrows_the_build_to_one_part(
    stack: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = _build(stack, capsys)
    vllm = _build(stack, capsys, "--only", "vllm")
    assert vllm["build"] != whole["build"]
    assert Path(str(vllm["wheel"])).parent.name == vllm["build"]  # the wheel step is the top
    assert os.readlink(stack.root / "result").endswith(str(vllm["build"]))
    assert stack.run("build", "--only", "banana") == 2
    assert "--only 'banana' is not an output of the stack" in capsys.readouterr().err
    assert stack.run("build", "--only", ",") == 2
    assert "--only names no output" in capsys.readouterr().err


def test_a_redirected_link_is_noticed_and_the_stack_made_again(
    stack: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _build(stack, capsys)
    entry = stack.store / "objects" / str(out["build"])
    link = entry / "manifest.json"
    os.chmod(entry, 0o755)
    link.unlink()
    link.symlink_to("/etc/hostname")
    assert main(["--store", str(stack.store), "store", "verify"]) == 1
    assert "manifest.json" in capsys.readouterr().out
    again = _build(stack, capsys, "--rebuild")
    assert again["build"] == out["build"]
    assert os.readlink(entry / "manifest.json").startswith("../")
    assert main(["--store", str(stack.store), "store", "verify"]) == 0


def test_gc_keeps_every_part_the_stack_links_to(
    stack: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _build(stack, capsys)
    assert main(["--store", str(stack.store), "gc"]) == 0
    result = stack.root / "result"
    for name in os.listdir(result):
        assert (result / name).is_file(), name  # every link still resolves
    assert Store(stack.store).get(str(out["build"])) is not None


def test_verify_follows_result_through_the_stack(
    stack: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify covers every installed part of the build: the patched tree, its dist-info
    and pthfa's wheel."""
    out = _build(stack, capsys)
    outputs = out["outputs"]
    assert isinstance(outputs, dict)
    site = tmp_path / "site"
    for wheel in (outputs["wheel"], outputs["pthfa"]):
        with zipfile.ZipFile(str(wheel)) as z:
            z.extractall(site)
    assert stack.run("verify", str(site)) == 0
    assert "holds exactly build" in capsys.readouterr().out
    cubin = next((site / "pthfa" / "cubins").glob("*.cubin"))
    cubin.write_bytes(cubin.read_bytes() + b"\0")
    assert stack.run("verify", str(site)) == 1
    assert f"drifted: pthfa/cubins/{cubin.name}" in capsys.readouterr().out
    cubin.unlink()
    (dist,) = site.glob("vllm-*.dist-info")
    meta = dist / "METADATA"
    meta.write_text(meta.read_text() + "Summary: edited\n")
    assert stack.run("verify", str(site)) == 1
    said = capsys.readouterr().out
    assert f"missing: pthfa/cubins/{cubin.name}" in said
    assert f"drifted: {dist.name}/METADATA" in said


def test_verify_names_the_dist_info_of_another_build(
    stack: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A site whose vLLM files are this build's but whose dist-info another build wrote is
    not this build (the review's site said +q38.47e4f46b while verify said +q38.28922950)."""
    out = _build(stack, capsys, "--only", "vllm")
    site = tmp_path / "site"
    with zipfile.ZipFile(str(out["wheel"])) as z:
        z.extractall(site)
    (dist,) = site.glob("vllm-*.dist-info")
    other = site / "vllm-0.0.1+q38.deadbeef.dist-info"
    meta = (dist / "METADATA").read_text()
    version = next(ln for ln in meta.splitlines() if ln.startswith("Version: "))[9:]
    dist.rename(other)
    (other / "METADATA").write_text(meta.replace(version, version.split("+")[0] + "+q38.deadbeef"))
    assert stack.run("verify", str(site)) == 1
    assert "another-build (0.0.1+q38.deadbeef)" in capsys.readouterr().out


def test_a_stack_build_reproduces(stack: Project, capsys: pytest.CaptureFixture[str]) -> None:
    out = _build(stack, capsys)
    assert stack.run("reproduce", str(out["build"]), "-q") == 0, capsys.readouterr()
    assert "reproduced" in capsys.readouterr().out


def _kind_entries(store: Path, kind: str) -> list[tuple[str, dict[str, object]]]:
    out = []
    for p in sorted((store / "objects").glob("*.json")):
        meta = json.loads(p.read_text())
        if meta["derivation"]["kind"] == kind:
            out.append((p.stem, meta))
    return out


def _retarget(store: Path, stack_digest: str, name: str, new_name: str, target: str,
              edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit a stack's link and its record together, as an attacker with write access
    would: the link text, its recorded target and hash agree, modes as sealed."""
    from qwen38build.store.entry import link_sha256

    entry = store / "objects" / stack_digest
    os.chmod(entry, 0o755)
    (entry / name).unlink()
    (entry / new_name).symlink_to(target)
    os.chmod(entry, 0o555)
    record = store / "objects" / f"{stack_digest}.json"
    meta = json.loads(record.read_text())
    del meta["outputs"][name]
    meta["outputs"][new_name] = {"link": target, "sha256": link_sha256(target), "size": 0}
    edit(meta)
    os.chmod(record, 0o644)
    record.write_text(json.dumps(meta, indent=1, sort_keys=True))


@pytest.mark.parametrize("attack", ["a folder linked to /etc", "the unpatched wheel",
                                    "the unpatched wheel, derivation edited too"])
def test_a_link_edited_with_its_record_is_corruption_and_never_served(
    attack: str, stack: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stack link is checked by what it points at: an entry its own derivation depends
    on, whose record lists that file with the sha256 the link recorded. Editing a link
    and its record together (into /etc through a linked folder of objects/, or onto the
    pristine wheel that the fetch step keeps) is corruption for `store verify`, and a
    build (its no-op as well) makes the stack again instead of handing it over."""
    out = _build(stack, capsys)
    stack_digest = str(out["build"])
    wheel = Path(str(out["wheel"])).name
    result = stack.root / "result"
    honest = (result / wheel).read_bytes()
    if attack == "a folder linked to /etc":
        fake = "f" * 64
        (stack.store / "objects" / fake).symlink_to("/etc")
        # The record names the link after what it reads (passwd), as the attacker wants.
        _retarget(stack.store, stack_digest, "manifest.json", "passwd", f"../{fake}/passwd",
                  lambda m: None)
        assert (result / "passwd").read_bytes() == Path("/etc/passwd").read_bytes()
        shown = "passwd"
    else:
        [(fetch, meta)] = [(d, m) for d, m in _kind_entries(stack.store, "fetch")
                           if any(n.startswith("vllm") for n in m["outputs"])]  # type: ignore[attr-defined]
        [pristine] = list(meta["outputs"])  # type: ignore[call-overload]

        def add_dep(m: dict[str, Any]) -> None:
            m["derivation"]["deps"].append(["vllm", fetch])

        _retarget(stack.store, stack_digest, wheel, wheel, f"../{fetch}/{pristine}",
                  add_dep if "derivation" in attack else (lambda m: None))
        assert (result / wheel).read_bytes() != honest  # the lie is in place
        shown = wheel
    assert main(["--store", str(stack.store), "store", "verify"]) == 1
    report = capsys.readouterr().out
    assert f"bad-link: {stack_digest}/{shown}" in report, report
    again = _build(stack, capsys)  # no --rebuild: the no-op must not hand it over
    assert again["build"] == stack_digest
    assert sorted(os.listdir(result)) == sorted(
        [wheel, "manifest.json", Path(out["outputs"]["pthfa"]).name])  # type: ignore[index]
    assert (result / wheel).read_bytes() == honest
    assert main(["--store", str(stack.store), "store", "verify"]) == 0, \
        capsys.readouterr().out
