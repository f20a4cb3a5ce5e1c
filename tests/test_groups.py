"""Optional series groups and their file overlays (issue 26), on the tiny project.

The ``kvarn`` group of the fixture is made optional, with an overlay of two files (a small
package ``kvq/``) and two patches written for these tests that wire it in: one imports it
from ``server.py``, one adds a knob line to ``envs.py``. Nothing of KVarN's is used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from qwen38build.engine import fastpath
from qwen38build.engine.plan import make_plan
from qwen38build.errors import UsageError
from qwen38build.inputs import lock, recipe
from tests.conftest import ENVS, SERVER, Project
from tests.engine_fixtures import sha256, write_patch

OVERLAY = {
    "kvq/__init__.py": "from kvq.codec import encode\n",
    "kvq/codec.py": "def encode(x):\n    return x * 2\n",
}
# cut on the files as the patches/ group leaves them (the fixture's route-fix and knob)
SERVED = SERVER.replace("return 3\n", "return 33\n")
ROUTE = SERVED.replace("    return 15\n", "    from vllm.kvq import codec\n    return codec.encode(15)\n")
KNOBS = ENVS.replace("KNOB_7 = 7\n", "KNOB_7 = 70\n")
KNOB = KNOBS.replace("KNOB_20 = 20\n", "KNOB_20 = 'kvq'\n")


def write_overlay(root: Path, files: dict[str, str], folder: str = "kvarn/files") -> Path:
    """The overlay folder with its files and a true MANIFEST."""
    top = root / folder
    for rel, text in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
    (top / "MANIFEST").write_text("".join(f"{sha256(top / rel)}  {rel}\n"
                                          for rel in sorted(files)))
    return top


def set_group(root: Path, extra: str) -> None:
    """Add ``extra`` lines to the kvarn group's table of recipe.toml."""
    path = root / "recipe.toml"
    path.write_text(path.read_text().replace('dir = "kvarn"\n', f'dir = "kvarn"\n{extra}'))


def kvarn(p: Project, *, overlay: bool = True, enabled: bool = False) -> None:
    """The kvarn group made optional, with its overlay and its two patches."""
    text = (p.root / "recipe.toml").read_text()
    (p.root / "recipe.toml").write_text(text.replace(
        'dir = "kvarn"\npatches = [\n]', 'dir = "kvarn"\npatches = [\n'
        '    "kvq-route.patch",\n    "kvq-knob.patch",\n]'))
    write_patch(p.root, "kvarn", "kvq-route", [("server.py", SERVED, ROUTE)], p.tmp / "kd")
    write_patch(p.root, "kvarn", "kvq-knob", [("envs.py", KNOBS, KNOB)], p.tmp / "kd")
    extra = "optional = true\n" + ('overlay = "files"\n' if overlay else "") + (
        "enabled = true\n" if enabled else "")
    if overlay:
        write_overlay(p.root, OVERLAY)
    set_group(p.root, extra)


def _build(p: Project, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    capsys.readouterr()
    assert p.run("build", "--json", *argv) == 0, capsys.readouterr().err
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def _members(wheel: object) -> dict[str, bytes]:
    with zipfile.ZipFile(str(wheel)) as z:
        return {n: z.read(n) for n in z.namelist()}


# -- the recipe ----------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "said"), [
    ('optional = "yes"\n', "series.groups.1.optional: Input should be a valid boolean"),
    ("enabled = true\n", "series.groups.1: enabled: only an optional group"),
    ('overlay = "../patches"\n', "series.groups.1.overlay: '../patches' must name a folder"),
    ('overlay = "files"\n', "series.groups.1.overlay: folder kvarn/files/ does not exist"),
    ("optional = 1\n", "series.groups.1.optional: Input should be a valid boolean"),
])
def test_bad_group_fields_name_the_recipe_and_the_key(
        project: Project, capsys: pytest.CaptureFixture[str], extra: str, said: str) -> None:
    set_group(project.root, extra)
    assert project.run("plan") == 2
    err = capsys.readouterr().err
    assert "recipe.toml" in err and said in err, err


def test_with_names_an_optional_group_or_is_a_usage_error(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    kvarn(project)
    assert project.run("build", "--with", "nope") == 2
    assert "--with 'nope' is not a group of the series" in capsys.readouterr().err
    assert project.run("build", "--with", "patches") == 2
    assert "--with 'patches' is not optional" in capsys.readouterr().err


# -- building with and without ----------------------------------------------------------


def test_optional_group_is_built_only_with_it_and_says_so(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    kvarn(project)
    capsys.readouterr()
    assert project.run("plan") == 0
    assert ("declared  -           -             series group kvarn/: declared, not built: "
            "optional, not requested") in capsys.readouterr().out
    without = _build(project, capsys)
    assert without["groups"] == ["patches"]
    files = _members(without["wheel"])
    assert "vllm/kvq/codec.py" not in files and b"codec" not in files["vllm/server.py"]
    built = _build(project, capsys, "--with", "kvarn")
    assert built["groups"] == ["patches", "kvarn"]
    assert built["build"] != without["build"]
    files = _members(built["wheel"])
    assert files["vllm/kvq/codec.py"] == OVERLAY["kvq/codec.py"].encode()
    assert b"codec.encode(15)" in files["vllm/server.py"]
    assert b"KNOB_20 = 'kvq'" in files["vllm/envs.py"] and b"KNOB_7 = 70" in files["vllm/envs.py"]
    # ./result's manifest and the build record say which groups were built
    manifest = json.loads((project.root / "result" / "manifest.json").read_text())
    assert manifest["groups"] == ["patches", "kvarn"]
    assert manifest["owned"]["kvq/codec.py"] == {
        "pristine": None, "patched": sha256(project.root / "kvarn/files/kvq/codec.py"),
        "owners": ["kvarn:overlay"]}
    assert manifest["owned"]["server.py"]["owners"] == ["route-fix", "kvarn/kvq-route"]
    record = json.loads((project.store / "builds" / f"{built['build']}.json").read_text())
    assert record["groups"] == ["patches", "kvarn"]
    # both are cached: each answers again with nothing to build, whichever came last
    loaded = recipe.load(project.root / "recipe.toml")
    from qwen38build.store.store import Store

    store = Store(project.store)
    for with_ in ((), ("kvarn",)):
        plan = make_plan(loaded, lock.read(project.root), with_=with_)
        assert all(store.get(s.digest) is not None for s in (plan.top, plan.targets["patch"]))
    assert _build(project, capsys, "--rebuild")["build"] == without["build"]
    assert _build(project, capsys, "--with", "kvarn", "--rebuild")["build"] == built["build"]


def test_enabled_builds_the_optional_group_by_default(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    kvarn(project, enabled=True)
    data = _build(project, capsys)
    assert data["groups"] == ["patches", "kvarn"]
    assert "vllm/kvq/codec.py" in _members(data["wheel"])
    capsys.readouterr()
    assert project.run("build") == 0
    assert "groups patches kvarn" in capsys.readouterr().out


def test_the_no_op_keys_on_with(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    kvarn(project)
    plain = _build(project, capsys)
    recipe_path = project.root / "recipe.toml"
    assert fastpath.lookup(project.store, recipe_path) is not None
    assert fastpath.lookup(project.store, recipe_path, with_=["kvarn"]) is None
    argv = ["--recipe", str(recipe_path), "--store", str(project.store), "build", "--json"]
    capsys.readouterr()
    assert fastpath.try_noop([*argv, "--with", "kvarn"]) is None
    assert fastpath.try_noop(argv) == 0
    assert json.loads(capsys.readouterr().out)["build"] == plain["build"]
    built = _build(project, capsys, "--with=kvarn")
    assert fastpath.try_noop([*argv, "--with", "kvarn"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["build"] == built["build"] and again["groups"] == ["patches", "kvarn"]


def test_the_overlay_files_are_inputs_of_the_patch_step(project: Project) -> None:
    kvarn(project)
    loaded = recipe.load(project.root / "recipe.toml")
    before = make_plan(loaded, lock.read(project.root), with_=["kvarn"]).targets["patch"]
    write_overlay(project.root, {**OVERLAY, "kvq/codec.py": "def encode(x):\n    return x\n"})
    after = make_plan(loaded, lock.read(project.root), with_=["kvarn"]).targets["patch"]
    assert before.digest != after.digest
    assert ("kvarn:overlay/kvq/codec.py", sha256(project.root / "kvarn/files/kvq/codec.py")) \
        in after.inputs
    assert after.params["overlays"] == [
        [2, "kvarn:overlay", ["kvq/__init__.py", "kvq/codec.py"], None]]
    # a file of the overlay its MANIFEST does not vouch for is refused before any build
    (project.root / "kvarn/files/kvq/extra.py").write_text("x = 1\n")
    from qwen38build.errors import InputError

    with pytest.raises(InputError, match="not listed in files/MANIFEST"):
        make_plan(loaded, lock.read(project.root), with_=["kvarn"])
    # and without the group, its overlay is not read at all
    assert make_plan(loaded, lock.read(project.root)).targets["patch"].params["overlays"] == []


def test_an_overlay_file_the_wheel_already_has_is_refused(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    kvarn(project)
    write_overlay(project.root, {**OVERLAY, "__init__.py": "x = 1\n"})
    capsys.readouterr()
    assert project.run("build", "--with", "kvarn") == 2
    err = capsys.readouterr().err
    assert "the overlay kvarn:overlay adds vllm/__init__.py, which the pinned wheel" in err


def test_verify_and_apply_name_the_group_as_owner_of_overlay_files(
        project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kvarn(project)
    built = _build(project, capsys, "--with", "kvarn")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
         "--disable-pip-version-check", "--no-index", "--target", str(site),
         str(built["wheel"])], check=True, capture_output=True)
    (site / "vllm" / "kvq" / "codec.py").write_text("drift\n")
    assert project.run("verify", str(site), "--json") == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert {"path": "vllm/kvq/codec.py", "kind": "drifted", "owners": ["kvarn:overlay"]} \
        in problems
    assert project.run("apply", str(site)) == 0
    assert "vllm/kvq/codec.py" in capsys.readouterr().out
    assert (site / "vllm" / "kvq" / "codec.py").read_text() == OVERLAY["kvq/codec.py"]


def test_plan_rejects_with_for_a_group_the_recipe_lacks(project: Project) -> None:
    loaded = recipe.load(project.root / "recipe.toml")
    with pytest.raises(UsageError, match="is not optional"):
        make_plan(loaded, lock.read(project.root), with_=["kvarn"])


def test_lint_checks_the_overlay_against_its_manifest(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    kvarn(project)
    capsys.readouterr()
    assert project.run("lint") == 0, capsys.readouterr()
    (project.root / "kvarn/files/kvq/codec.py").write_text("def encode(x):\n    return 0\n")
    (project.root / "kvarn/files/kvq/stray.py").write_text("y = 2\n")
    assert project.run("lint") != 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "[provenance] kvarn/files/kvq/codec.py has sha256" in text
    assert "kvarn/files/kvq/stray.py is not listed in kvarn/files/MANIFEST" in text
    # a build with the group refuses it too (before anything is applied)
    assert project.run("build", "--with", "kvarn") == 2


# -- a group from an external source (a fixed-output tree) ----------------------------------

COMMIT = "c0ffee00" + "1" * 32
SOURCE = f"""
[sources.kvq-src]
repository = "https://example.invalid/kvq"
commit = "{COMMIT}"
paths = ["overlay", "LICENSE"]

[fetch]
mirrors = ["../mirror"]
"""


def source_group(p: Project, *, lock_it: bool, enabled: bool = False) -> Path:
    """The kvarn group's overlay from the tree ``kvq-src``, held unpacked in a mirror folder
    (``overlay/`` is the overlay, package-relative); locked in lock/sources.json or not."""
    kvarn(p, overlay=False, enabled=enabled)
    set_group(p.root, 'source = "kvq-src"\noverlay = "overlay"\n')
    (p.root / "recipe.toml").write_text((p.root / "recipe.toml").read_text() + SOURCE)
    tree = p.root.parent / "mirror" / f"kvq-{COMMIT[:8]}"
    for rel, text in OVERLAY.items():
        (tree / "overlay" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / "overlay" / rel).write_text(text)
    (tree / "LICENSE").write_text("Apache-2.0\n")
    (tree / "README.md").write_text("not in the paths\n")
    if lock_it:
        from qwen38build.trees.treehash import tree_hash

        loaded = recipe.load(p.root / "recipe.toml")
        lock.write(p.root, list(lock.read(p.root).values()), [lock.LockedTree(
            "kvq-src", "https://example.invalid/kvq", COMMIT, ("overlay", "LICENSE"),
            tree_hash(tree, ("overlay", "LICENSE")))])
        assert lock.read_trees(loaded.root)["kvq-src"].commit == COMMIT
    return tree


def test_a_group_whose_source_is_not_locked_is_declared_not_built(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    source_group(project, lock_it=False, enabled=True)
    capsys.readouterr()
    assert project.run("plan") == 0
    assert ("series group kvarn/: declared, not built: its source 'kvq-src' is not locked "
            "(lock/sources.json); the stack builds without it") in capsys.readouterr().out
    data = _build(project, capsys)  # enabled, but its source is not there: built without
    assert data["groups"] == ["patches"]
    assert "vllm/kvq/codec.py" not in _members(data["wheel"])
    capsys.readouterr()
    assert project.run("build", "--with", "kvarn") == 2
    err = capsys.readouterr().err
    assert "--with 'kvarn': its source 'kvq-src' is not locked" in err


def test_a_locked_source_group_brings_its_tree_as_the_overlay(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    tree = source_group(project, lock_it=True)
    loaded = recipe.load(project.root / "recipe.toml")
    patch = make_plan(loaded, lock.read(project.root), with_=["kvarn"]).targets["patch"]
    assert patch.params["overlays"] == [[2, "kvarn:overlay", None, "overlay"]]
    assert patch.dep("kvarn:overlay").kind == "source"
    built = _build(project, capsys, "--with", "kvarn")
    assert built["groups"] == ["patches", "kvarn"]
    files = _members(built["wheel"])
    assert files["vllm/kvq/codec.py"] == OVERLAY["kvq/codec.py"].encode()
    assert "vllm/LICENSE" not in files and "vllm/README.md" not in files
    assert b"codec.encode(15)" in files["vllm/server.py"]
    manifest = json.loads((project.root / "result" / "manifest.json").read_text())
    assert manifest["owned"]["kvq/__init__.py"]["owners"] == ["kvarn:overlay"]
    # the tree is fixed-output: another tree under the same commit is refused, not built
    (tree / "overlay" / "kvq" / "codec.py").write_text("def encode(x):\n    return 0\n")
    import shutil

    shutil.rmtree(project.store)
    capsys.readouterr()
    assert project.run("build", "--with", "kvarn", "--rebuild") != 0
    # and without --with the group is not built, its source never read
    assert _build(project, capsys, "--rebuild")["groups"] == ["patches"]


def test_a_group_source_names_a_sources_table(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    set_group(project.root, 'optional = true\nsource = "nope"\n')
    assert project.run("plan") == 2
    assert "series.groups.1.source: 'nope' names no [sources.nope] table" in \
        capsys.readouterr().err


# -- the workspace round trip ---------------------------------------------------------------


def test_the_workspace_holds_the_overlay_as_a_topic_and_export_writes_it_back(
        project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from qwen38build.store.store import Store
    from qwen38build.workspace import gitrepo, workspace

    kvarn(project)
    loaded = recipe.load(project.root / "recipe.toml")
    repo = workspace.create(loaded, Store(project.store), tmp_path / "ws")
    assert gitrepo.git(repo, "log", "--reverse", "--format=%s").splitlines()[1:] == [
        "[qwen38] route-fix", "[qwen38] knob", "[qwen38] kvarn:overlay",
        "[qwen38] kvarn/kvq-route", "[qwen38] kvarn/kvq-knob"]
    assert (repo / "vllm/kvq/codec.py").read_text() == OVERLAY["kvq/codec.py"]
    assert "MANIFEST" not in gitrepo.git(repo, "ls-files")
    before = {p: p.read_bytes() for p in sorted((project.root / "kvarn").rglob("*"))
              if p.is_file()}
    # an unedited round trip changes nothing, the overlay and its MANIFEST included
    assert workspace.export(loaded, repo, check=True) == []
    assert workspace.export(loaded, repo) == []
    # edits to the overlay are commits folded into its topic; export writes the folder back
    (repo / "vllm/kvq/codec.py").write_text("def encode(x):\n    return x * 3\n")
    (repo / "vllm/kvq/tables.py").write_text("T = (1, 2)\n")
    (repo / "vllm/kvq/__init__.py").unlink()
    gitrepo.git(repo, "add", "-A")
    gitrepo.git(repo, "commit", "-qm", "fixup! [qwen38] kvarn:overlay")
    files = project.root / "kvarn/files"
    assert sorted(workspace.export(loaded, repo, check=True)) == sorted([
        files / "kvq/__init__.py", files / "kvq/codec.py", files / "kvq/tables.py",
        files / "MANIFEST"])
    assert {p: p.read_bytes() for p in before} == before  # --check wrote nothing
    workspace.export(loaded, repo, ["kvarn:overlay"])
    assert (files / "kvq/codec.py").read_text() == "def encode(x):\n    return x * 3\n"
    assert (files / "kvq/tables.py").read_text() == "T = (1, 2)\n"
    assert not (files / "kvq/__init__.py").exists()
    assert (files / "MANIFEST").read_text() == (
        f"{sha256(files / 'kvq/codec.py')}  kvq/codec.py\n"
        f"{sha256(files / 'kvq/tables.py')}  kvq/tables.py\n")
    assert workspace.export(loaded, repo, check=True) == []
    # what export wrote is what lint and the build take
    capsys.readouterr()
    assert project.run("lint") == 0, capsys.readouterr()
    built = _build(project, capsys, "--with", "kvarn")
    members = _members(built["wheel"])
    assert members["vllm/kvq/tables.py"] == b"T = (1, 2)\n"
    assert "vllm/kvq/__init__.py" not in members


def test_the_no_op_misses_when_an_overlay_file_changes_or_appears(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    kvarn(project)
    _build(project, capsys, "--with", "kvarn")
    recipe_path = project.root / "recipe.toml"
    assert fastpath.lookup(project.store, recipe_path, with_=["kvarn"]) is not None
    codec = project.root / "kvarn/files/kvq/codec.py"
    before = codec.read_bytes()
    codec.write_bytes(before + b"# edited\n")
    assert fastpath.lookup(project.store, recipe_path, with_=["kvarn"]) is None
    codec.write_bytes(before)
    assert fastpath.lookup(project.store, recipe_path, with_=["kvarn"]) is not None
    (project.root / "kvarn/files/kvq/new.py").write_text("z = 3\n")
    assert fastpath.lookup(project.store, recipe_path, with_=["kvarn"]) is None


def test_a_link_in_the_source_tree_never_reaches_the_package(
        project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    tree = source_group(project, lock_it=False)
    os.symlink("/etc/hostname", tree / "overlay" / "kvq" / "host.py")
    from qwen38build.trees.treehash import tree_hash

    lock.write(project.root, list(lock.read(project.root).values()), [lock.LockedTree(
        "kvq-src", "https://example.invalid/kvq", COMMIT, ("overlay", "LICENSE"),
        tree_hash(tree, ("overlay", "LICENSE")))])
    capsys.readouterr()
    assert project.run("build", "--with", "kvarn", "--json") != 0
    err = capsys.readouterr().err
    # the store keeps no such link (store.entry), and the patch step follows none
    assert "overlay/kvq/host.py is a symlink to /etc/hostname" in err, err
    assert not any(p.name == "host.py" and not p.is_symlink()
                   for p in (project.store / "objects").rglob("host.py"))
